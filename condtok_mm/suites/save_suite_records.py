"""Keep a suite run's records: copy what tools/suites/run_suite.py reads of each finished cell (its fingerprint,
its test metrics, its training scalars) and the suite's tables and plots from OUT_DIR into RECORD_DIR, without
checkpoints, so that the run can be committed, gathered again and continued on another machine.

    python tools/suites/save_suite_records.py OUT_DIR RECORD_DIR

A finished cell is a work dir with the runner's suite_cell.json and a test run whose JSON holds COCO metrics;
the newest test run and every training run (a resumed cell's curves are joined from all of them) are kept,
under the same relative paths. So is a cell whose loss diverged and whose test ended on its final checkpoint
without a result (its suite_cell.json holds that checkpoint's SHA-256, as the runner records it once a test has
ended), with its test.log, which says why, and the test's JSON if it wrote one: a study whose rule counts such a
cell as test AP 0 (condtok_mm/suites/confirmatory.py) reads that from the records, and a resumed run does not
train it again there (its checkpoint is not there to test again). Then

    python tools/suites/run_suite.py SUITE --gather-only --out-dir RECORD_DIR   # the tables, again
    python tools/suites/run_suite.py SUITE --resume --out-dir RECORD_DIR        # the cells still to run

gather and continue the run from the records (each cell still checked against the suite by its fingerprint).
Other cells that were not finished are left out (one trained but not tested, or whose test was stopped, among
them): a resumed run trains them from the start. Copying again updates the records; nothing already there is
deleted.
"""
import argparse
import os
import os.path as osp
import shutil
import sys

from .fingerprint import FINGERPRINT_FILE, cell_record
from .plan import Cell
from .report import REPORT_FILES
from .results import UnreadableCellFile, cell_results, diverged_untestable, evaluation, newest, training_runs
from .schema import EscapeRule


def kept_cells(out_dir):
    """{work dir: its test files to keep} of the work dirs under ``out_dir`` that hold a fingerprint and either an
    evaluation (its newest JSON) or, where the loss diverged and the test ended without a result
    (:func:`~condtok_mm.suites.results.diverged_untestable`), the test's log and its newest JSON if it wrote one;
    sorted."""
    found = {}
    for root, dirs, files in os.walk(out_dir):
        dirs.sort()
        if FINGERPRINT_FILE not in files:
            continue
        cell = Cell('', 0, 0, root, '', '')
        try:
            evaluated = evaluation(cell)
            # the escape rule does not change whether the loss diverged
            untestable = not evaluated and diverged_untestable(cell_results(cell, EscapeRule()), cell_record(cell))
        except UnreadableCellFile as error:
            print(f'not recorded: {error}', file=sys.stderr)
            continue
        if evaluated:
            found[root] = [evaluated[0]]
        elif untestable:
            tested = (osp.join(root, 'test.log'), newest(osp.join(root, 'test', '*', '*.json')))
            found[root] = [path for path in tested if path and osp.isfile(path)]
        else:
            continue
        dirs.clear()  # a kept cell holds no cell
    return found


def cell_records(work_dir, test_files):
    """The files of a kept cell the runner reads: fingerprint, ``test_files``, every training run's scalars."""
    return [osp.join(work_dir, FINGERPRINT_FILE), *test_files] + training_runs(work_dir)


def save_records(out_dir, record_dir):
    """Copy every kept cell's records (:func:`kept_cells`) and the suite's report files; returns the cells' relative
    dirs."""
    kept = kept_cells(out_dir)
    for work_dir, test_files in kept.items():
        for path in cell_records(work_dir, test_files):
            target = osp.join(record_dir, osp.relpath(path, out_dir))
            os.makedirs(osp.dirname(target), exist_ok=True)
            shutil.copy2(path, target)
    for name in REPORT_FILES:
        if osp.isfile(osp.join(out_dir, name)):
            os.makedirs(record_dir, exist_ok=True)
            shutil.copy2(osp.join(out_dir, name), osp.join(record_dir, name))
    return [osp.relpath(work_dir, out_dir) for work_dir in kept]


def main(argv=None):
    parser = argparse.ArgumentParser(description="Copy a suite run's finished cells' records (no checkpoints)")
    parser.add_argument('out_dir', help="the suite run's --out-dir")
    parser.add_argument('record_dir', help='where the records go (e.g. docs/en/studies/records/SUITE)')
    args = parser.parse_args(argv)
    if not osp.isdir(args.out_dir):
        parser.error(f'{args.out_dir} is not a directory (give the --out-dir of a suite run)')
    cells = save_records(args.out_dir, args.record_dir)
    print(f'{len(cells)} cell(s) of {args.out_dir} recorded in {args.record_dir}')


if __name__ == '__main__':
    main()
