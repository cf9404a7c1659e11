"""Create the embedded synthetic COCO-format shapes dataset (used by the demo configs and the tests).

    python tools/dataset/make_shapes.py [--out-dir data/shapes/] [--num-train 200] [--num-val 50] [--num-test 0]

Each split is drawn from its own seed stream, so a held-out test split (--num-test) leaves the training and
validation images as they are without it, byte for byte.
"""
import argparse
import json
import os.path as osp
import sys
import time

from .shapes import MIN_IMAGE_SIDE, make_shapes_dataset


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='Create the synthetic COCO-format shapes dataset')
    parser.add_argument('--out-dir', default='data/shapes/', help='output folder')
    parser.add_argument('--num-train', type=int, default=200, help='training images')
    parser.add_argument('--num-val', type=int, default=50, help='validation images')
    parser.add_argument('--num-test', type=int, default=0,
                        help='held-out test images, written to test/ and annotations/instances_test.json (default: '
                        'none)')
    parser.add_argument('--size', type=int, nargs=2, default=(128, 128), metavar=('H', 'W'),
                        help='image height and width')
    parser.add_argument('--seed', type=int, default=0, help='base random seed')
    parser.add_argument('--force', action='store_true', help='rewrite the dataset if it exists')
    args = parser.parse_args(argv)
    for option, count in (('--num-train', args.num_train), ('--num-val', args.num_val)):
        if count < 1:
            parser.error(f'{option} {count}: a split needs at least 1 image (training and evaluation read both)')
    if args.num_test < 0:
        parser.error(f'--num-test {args.num_test}: give 0 (no test split) or more images')
    if min(args.size) < MIN_IMAGE_SIDE:
        parser.error(f'--size {args.size[0]} {args.size[1]}: images need sides of at least {MIN_IMAGE_SIDE} pixels '
                     'to hold a shape (the shapes are 8-22 % of the shorter side, at least 40 pixels each)')
    return args


def main(argv=None):
    args = parse_args(argv)
    marker = osp.join(args.out_dir, 'annotations', 'instances_val.json')
    if osp.exists(marker) and not args.force:
        counts = {}
        for split in ('train', 'val', 'test'):
            path = osp.join(args.out_dir, 'annotations', f'instances_{split}.json')
            if osp.exists(path):
                with open(path) as f:
                    counts[split] = len(json.load(f)['images'])
        wanted = dict(train=args.num_train, val=args.num_val, **(dict(test=args.num_test) if args.num_test else {}))
        if counts != wanted:  # e.g. --num-val 200 into the 50-image default
            have = ', '.join(f'{n} {split}' for split, n in counts.items())
            asked = ', '.join(f'{n} {split}' for split, n in wanted.items())
            sys.exit(f'error: the shapes dataset at {args.out_dir} has {have} images, not the {asked} asked for; '
                     'give another --out-dir (e.g. data/shapes_val200/) or --force to rewrite it')
        print(f'shapes dataset already at {args.out_dir} (use --force to rewrite it)')
        return
    start = time.time()
    ann_files = make_shapes_dataset(args.out_dir, num_train=args.num_train, num_val=args.num_val,
                                    image_size=tuple(args.size), seed=args.seed, num_test=args.num_test)
    test = f' and {args.num_test} test' if args.num_test else ''
    print(f'wrote {args.num_train} train, {args.num_val} val{test} images to {args.out_dir} in '
          f'{time.time() - start:.1f} s: ' + ', '.join(ann_files.values()))


if __name__ == '__main__':
    main()
