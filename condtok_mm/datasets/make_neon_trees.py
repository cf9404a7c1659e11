"""Create the NEON tree-crown detection dataset (real aerial photographs; configs/neon/) from the deepforest 2.1.0 wheel.

    python tools/dataset/make_neon_trees.py [--out-dir data/neon_trees/] [--wheel PATH | --cache-dir data/downloads/]

Without --wheel it fetches the pinned wheel once with ``pip download --no-deps --only-binary=:all:
deepforest==2.1.0`` (no dependencies, nothing built or installed), refuses it unless its SHA-256 is
8c2798d8e9be7f0004b194fe207b76c1d9fff6e711b3db67b9508dcd5d00ae54, and reads its deepforest/data/ as a zip
archive. It writes COCO-format tiles: 400 px squares, neighbours overlapping by --overlap px (0), the last tile of
a row or column moved back to the edge; a box is a tree in a tile if at least --min-visible (0.5) of its area is
inside, an ignore region (iscrowd 1) if less, nothing if under 1 px. Splits by image: train = the large
Yellowstone image above a 128-row guard band, val = its bottom 400 rows, test = the second Yellowstone image,
other_sites = OSBS_029 and SOAP_061 (Dead/Alive merged into 'tree'); condtok_mm/datasets/neon_trees.py says why.
A second run with the same arguments changes nothing (manifest.json holds every file's SHA-256).
Source: weecology/DeepForest, MIT licence (copied to OUT_DIR/LICENSE).
"""
import argparse
import glob
import os
import os.path as osp
import subprocess
import sys
import time

from .neon_trees import SOURCE_URL, SPLITS, WHEEL_NAME, make_neon_trees_dataset


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description='Create the NEON tree-crown COCO dataset from the deepforest 2.1.0 wheel (MIT licence)',
        epilog='Tiles: square, --tile px, neighbours overlapping by --overlap px, the last one moved back to the '
        "image's edge. Clipping: a box with at least --min-visible of its area in a tile is a tree there, a smaller "
        'part an ignore region (iscrowd 1), a part under 1 px nothing. Splits by image: train = '
        '2019_YELL_2_528000_4978000_image_crop2 above the guard band, val = its bottom --val-rows rows, test = '
        '2019_YELL_2_541000_4977000_image_crop, other_sites = OSBS_029 + SOAP_061.')
    parser.add_argument('--out-dir', default='data/neon_trees/', help='output folder')
    source = parser.add_mutually_exclusive_group()
    source.add_argument('--wheel', help=f'the {WHEEL_NAME} file to read (nothing is fetched)')
    source.add_argument('--cache-dir', default='data/downloads/', help='where the wheel is fetched to once')
    parser.add_argument('--tile', type=int, default=400, help='tile side in pixels')
    parser.add_argument('--overlap', type=int, default=0, help='overlap of neighbouring tiles in pixels')
    parser.add_argument('--val-rows', type=int, default=400,
                        help='rows at the bottom of the training image that are the validation split')
    parser.add_argument('--guard', type=int, default=128,
                        help='rows between the training and the validation part that no tile covers')
    parser.add_argument('--min-visible', type=float, default=0.5,
                        help='least fraction of a box inside a tile for it to be a tree there')
    parser.add_argument('--force', action='store_true', help='rewrite a dataset made with other arguments')
    args = parser.parse_args(argv)
    if args.tile < 32:
        parser.error(f'--tile {args.tile}: tiles need sides of at least 32 px (mmdet drops smaller images)')
    if not 0 <= args.overlap < args.tile:
        parser.error(f'--overlap {args.overlap}: at least 0 and less than --tile {args.tile}')
    if not 0 < args.min_visible <= 1:
        parser.error(f'--min-visible {args.min_visible}: a fraction in (0, 1]')
    return args


def fetch_wheel(cache_dir):
    """The wheel in ``cache_dir``, fetched there by pip (no dependencies, wheels only) if it is not there yet."""
    wheel = osp.join(cache_dir, WHEEL_NAME)
    if not osp.exists(wheel):
        os.makedirs(cache_dir, exist_ok=True)
        command = [sys.executable, '-m', 'pip', 'download', '--no-deps', '--only-binary=:all:', 'deepforest==2.1.0',
                   '-d', cache_dir]
        print('fetching: ' + ' '.join(command))
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode or not osp.exists(wheel):
            sys.exit(f'error: `{" ".join(command)}` did not fetch {WHEEL_NAME} (found '
                     f'{sorted(glob.glob(osp.join(cache_dir, "*.whl")))}):\n{result.stderr[-2000:]}\n'
                     'download it by hand and give its path with --wheel')
    return wheel


def main(argv=None):
    args = parse_args(argv)
    wheel = args.wheel or fetch_wheel(args.cache_dir)
    start = time.time()
    try:
        manifest, written = make_neon_trees_dataset(
            wheel, args.out_dir, force=args.force, tile=args.tile, overlap=args.overlap, val_rows=args.val_rows,
            guard=args.guard, min_visible=args.min_visible)
    except (FileNotFoundError, FileExistsError, ValueError) as error:
        sys.exit(f'error: {error}')
    print(f'{"wrote" if written else "unchanged (manifest.json matches)"} {args.out_dir} in '
          f'{time.time() - start:.1f} s')
    print(f'source: {WHEEL_NAME} deepforest/data/ (SHA-256 {manifest["wheel_sha256"]}), {SOURCE_URL}; '
          'licence: MIT, Copyright (c) 2019 Ben Weinstein')
    print(f'{"split":<12}{"tiles":>6}{"empty":>6}{"trees":>6}{"ignored":>8}')
    for split in SPLITS:
        c = manifest['counts'][split]
        print(f'{split:<12}{c["tiles"]:>6}{c["empty_tiles"]:>6}{c["boxes"]:>6}{c["ignore_regions"]:>8}')


if __name__ == '__main__':
    main()
