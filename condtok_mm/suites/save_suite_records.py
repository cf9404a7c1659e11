"""Keep a suite run's records: copy what tools/suites/run_suite.py reads of each finished cell (its fingerprint,
its test metrics, its training scalars) and the suite's tables and plots from OUT_DIR into RECORD_DIR, without
checkpoints, so that the run can be committed, gathered again and continued on another machine.

    python tools/suites/save_suite_records.py OUT_DIR RECORD_DIR

A finished cell is a work dir with the runner's suite_cell.json and a test run whose JSON holds COCO metrics;
the newest test run and every training run (a resumed cell's curves are joined from all of them) are kept,
under the same relative paths. Then

    python tools/suites/run_suite.py SUITE --gather-only --out-dir RECORD_DIR   # the tables, again
    python tools/suites/run_suite.py SUITE --resume --out-dir RECORD_DIR        # the cells still to run

gather and continue the run from the records (each cell still checked against the suite by its fingerprint).
Cells that were not finished are left out: a resumed run trains them from the start. Copying again updates the
records; nothing already there is deleted.
"""
import argparse
import os
import os.path as osp
import shutil
import sys

from .fingerprint import FINGERPRINT_FILE
from .plan import Cell
from .report import REPORT_FILES
from .results import UnreadableCellFile, evaluation, training_runs


def finished_cells(out_dir):
    """{work dir: its newest evaluation JSON} of the work dirs under ``out_dir`` that hold a fingerprint and an
    evaluation, sorted."""
    found = {}
    for root, dirs, files in os.walk(out_dir):
        dirs.sort()
        try:
            evaluated = FINGERPRINT_FILE in files and evaluation(Cell('', 0, 0, root, '', ''))
        except UnreadableCellFile as error:
            print(f'not recorded: {error}', file=sys.stderr)
            evaluated = None
        if evaluated:
            found[root] = evaluated[0]
            dirs.clear()  # a finished cell holds no cell
    return found


def cell_records(work_dir, evaluation_path):
    """The files of a finished cell the runner reads: fingerprint, newest test JSON, every training run's scalars."""
    return [osp.join(work_dir, FINGERPRINT_FILE), evaluation_path] + training_runs(work_dir)


def save_records(out_dir, record_dir):
    """Copy every finished cell's records and the suite's report files; returns the cells' relative dirs."""
    finished = finished_cells(out_dir)
    for work_dir, evaluation_path in finished.items():
        for path in cell_records(work_dir, evaluation_path):
            target = osp.join(record_dir, osp.relpath(path, out_dir))
            os.makedirs(osp.dirname(target), exist_ok=True)
            shutil.copy2(path, target)
    for name in REPORT_FILES:
        if osp.isfile(osp.join(out_dir, name)):
            os.makedirs(record_dir, exist_ok=True)
            shutil.copy2(osp.join(out_dir, name), osp.join(record_dir, name))
    return [osp.relpath(work_dir, out_dir) for work_dir in finished]


def main(argv=None):
    parser = argparse.ArgumentParser(description="Copy a suite run's finished cells' records (no checkpoints)")
    parser.add_argument('out_dir', help="the suite run's --out-dir")
    parser.add_argument('record_dir', help='where the records go (e.g. docs/en/studies/records/SUITE)')
    args = parser.parse_args(argv)
    if not osp.isdir(args.out_dir):
        parser.error(f'{args.out_dir} is not a directory (give the --out-dir of a suite run)')
    cells = save_records(args.out_dir, args.record_dir)
    print(f'{len(cells)} finished cell(s) of {args.out_dir} recorded in {args.record_dir}')


if __name__ == '__main__':
    main()
