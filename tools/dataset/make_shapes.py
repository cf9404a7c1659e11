"""Create the embedded synthetic COCO-format shapes dataset (used by the demo configs and the tests).

    python tools/dataset/make_shapes.py [--out-dir data/shapes/] [--num-train 200] [--num-val 50]
"""
import argparse
import json
import os.path as osp
import sys
import time

sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))
from condtok_mm.datasets.shapes import MIN_IMAGE_SIDE, make_shapes_dataset  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='Create the synthetic COCO-format shapes dataset')
    parser.add_argument('--out-dir', default='data/shapes/', help='output folder')
    parser.add_argument('--num-train', type=int, default=200, help='training images')
    parser.add_argument('--num-val', type=int, default=50, help='validation images')
    parser.add_argument('--size', type=int, nargs=2, default=(128, 128), metavar=('H', 'W'),
                        help='image height and width')
    parser.add_argument('--seed', type=int, default=0, help='base random seed')
    parser.add_argument('--force', action='store_true', help='rewrite the dataset if it exists')
    args = parser.parse_args(argv)
    for option, count in (('--num-train', args.num_train), ('--num-val', args.num_val)):
        if count < 1:
            parser.error(f'{option} {count}: a split needs at least 1 image (training and evaluation read both)')
    if min(args.size) < MIN_IMAGE_SIDE:
        parser.error(f'--size {args.size[0]} {args.size[1]}: images need sides of at least {MIN_IMAGE_SIDE} pixels '
                     'to hold a shape (the shapes are 8-22 % of the shorter side, at least 40 pixels each)')
    return args


def main(argv=None):
    args = parse_args(argv)
    marker = osp.join(args.out_dir, 'annotations', 'instances_val.json')
    if osp.exists(marker) and not args.force:
        counts = {}
        for split in ('train', 'val'):
            with open(osp.join(args.out_dir, 'annotations', f'instances_{split}.json')) as f:
                counts[split] = len(json.load(f)['images'])
        if counts != dict(train=args.num_train, val=args.num_val):  # e.g. --num-val 200 into the 50-image default
            sys.exit(f'error: the shapes dataset at {args.out_dir} has {counts["train"]} train and {counts["val"]} '
                     f'val images, not the {args.num_train} and {args.num_val} asked for; give another --out-dir '
                     '(e.g. data/shapes_val200/) or --force to rewrite it')
        print(f'shapes dataset already at {args.out_dir} (use --force to rewrite it)')
        return
    start = time.time()
    ann_files = make_shapes_dataset(args.out_dir, num_train=args.num_train, num_val=args.num_val,
                                    image_size=tuple(args.size), seed=args.seed)
    print(f'wrote {args.num_train} train and {args.num_val} val images to {args.out_dir} in '
          f'{time.time() - start:.1f} s: ' + ', '.join(ann_files.values()))


if __name__ == '__main__':
    main()
