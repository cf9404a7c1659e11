"""Print the COCO metrics of the latest tools/test.py run in a work dir, and where its drawn images are.

    python tools/analysis/summarize_test.py WORK_DIR
"""
import argparse
import glob
import json
import os.path as osp
import sys


def latest_test_run(work_dir):
    """(metrics dict, run folder) of the newest ``WORK_DIR/<timestamp>/<timestamp>.json``."""
    runs = sorted(p for p in glob.glob(osp.join(work_dir, '*', '*.json'))
                  if osp.basename(p)[:-5] == osp.basename(osp.dirname(p)))
    if not runs:
        sys.exit(f'error: no tools/test.py results under {work_dir} (expected <timestamp>/<timestamp>.json)')
    with open(runs[-1]) as f:
        return json.load(f), osp.dirname(runs[-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description='Summarize a tools/test.py run')
    parser.add_argument('work_dir', help='the --work-dir given to tools/test.py')
    args = parser.parse_args(argv)
    metrics, run_dir = latest_test_run(args.work_dir)
    print(f'\nCOCO evaluation ({run_dir}):')
    print(f'{"task":<6} {"AP":>6} {"AP50":>6} {"AP75":>6} {"APs":>6} {"APm":>6} {"APl":>6}')
    for task in ('bbox', 'segm'):
        if f'coco/{task}_mAP' not in metrics:
            continue
        row = [metrics[f'coco/{task}_mAP{suffix}'] for suffix in ('', '_50', '_75', '_s', '_m', '_l')]
        # COCO's -1 for an area range without a ground-truth object: no AP there, not a value of -100
        print(f'{task:<6} ' + ' '.join(f'{100 * v:6.1f}' if v >= 0 else f'{"–":>6}' for v in row))
    drawn = sorted(glob.glob(osp.join(run_dir, '**', '*.png'), recursive=True))
    if drawn:
        print(f'{len(drawn)} val images with the predicted boxes and masks drawn: '
              f'{osp.dirname(drawn[0])}/ (e.g. {drawn[0]})')


if __name__ == '__main__':
    main()
