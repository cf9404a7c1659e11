"""Run a benchmark suite: every (variant, learning rate, seed) cell of a suite file through tools/train.py and
tools/test.py, on this machine or a cluster, and gather the results.

    python tools/benchmark/run_suite.py SUITE [--out-dir DIR] [--launcher none|pytorch|slurm] [--jobs N]
        [--nproc N] [--partition P] [--resume] [--dry-run] [--gather-only] [--cfg-options KEY=VALUE ...]

A suite is an mmengine config file (configs/suites/*.py, may ``_base_`` another) with the keys

    variants = dict(NAME=dict(config=PATH, cfg_options={KEY: VALUE}, lrs=None | [LR, ...] | dict(best_of=NAME),
                              description=TEXT), ...)   # ordered; each a config plus --cfg-options
    reference = NAME        # the variant that paired differences are taken against
    seeds = [0, 1, 2]       # one run per seed; the same seed gives every variant the same initial weights
    lrs = [LR, ...]         # learning rates of the variants whose ``lrs`` is None
    lr_key = 'optim_wrapper.optimizer.lr'
    metric = 'coco/bbox_mAP'    # ranks the learning rates of a variant (best_of, the best-rate table)
    cfg_options = {KEY: VALUE}  # for every cell, before the variant's own
    _name = ...             # keys starting with _ are the file's own shorthands, ignored

A variant with ``lrs=dict(best_of=NAME)`` runs after NAME's cells, at NAME's learning rate with the best
mean ``metric`` over seeds. Every cell trains in OUT_DIR/VARIANT/lrLR/seedS (train.log there) with
``randomness.seed=S``, the learning rate at ``lr_key``, the suite's, the variant's and then this command's
--cfg-options; then tools/test.py evaluates its final checkpoint into OUT_DIR/VARIANT/lrLR/seedS/test
(test.log there). A failed cell does not stop the others: its log tail is printed and the runner exits with 1.

Launchers (the distributed engine is mmdet's: torchrun or SLURM; the runner only starts the commands):
    none     tools/train.py, tools/test.py; --jobs cells at a time, the usable CPUs shared out between them
    pytorch  tools/dist_train.sh CONFIG NPROC, tools/dist_test.sh (torchrun), --nproc processes per cell,
             --jobs cells at a time on distinct ports (PORT=29500 + slot)
    slurm    tools/slurm_train.sh PARTITION JOB CONFIG WORK_DIR, tools/slurm_test.sh (srun), GPUS=--nproc per
             cell, --jobs cells queued at a time

--resume reuses finished cells (their evaluation exists), tests trained ones and resumes interrupted ones from
their last checkpoint (tools/train.py --resume); without it the runner refuses an OUT_DIR that already holds
cells, so that nothing is overwritten. --dry-run prints the commands and runs nothing.

Writes to OUT_DIR: suite.md (per variant and learning rate: metrics mean +- sample std over seeds, the paired
difference to the reference at the same rate with a 95 % t interval over seeds, final training loss, runs
that plateaued, diverged or failed; then the best-rate row of each variant, with its paired difference to
the reference's best-rate row), suite.json (every cell's values and loss curve, and the aggregates),
ap_vs_lr.png (the metric against the learning rate per variant), loss.png and kappa.png (loss and kappa
curves at each variant's best rate, where the configs record kappa), and prints the tables.
"""
import argparse
import os
import os.path as osp
import shlex
import sys
import time

REPO_ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
sys.path.insert(0, REPO_ROOT)  # run from a checkout, installed or not
from condtok_mm.benchmark.launch import LAUNCHERS, commands, run_pending  # noqa: E402
from condtok_mm.benchmark.plan import cells_of_phase  # noqa: E402
from condtok_mm.benchmark.plots import plot  # noqa: E402
from condtok_mm.benchmark.report import REPORT_FILES, summary_of, write_tables  # noqa: E402
from condtok_mm.benchmark.results import cell_results, cell_state  # noqa: E402
from condtok_mm.benchmark.schema import SuiteError, load_suite, phase_of  # noqa: E402
from condtok_mm.benchmark.statistics import aggregate  # noqa: E402
from condtok_mm.utils import describe_machine  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description='Train and test every (variant, learning rate, seed) of a suite and gather the results')
    parser.add_argument('suite', help='suite file, e.g. configs/suites/demo_controls_swin.py')
    parser.add_argument('--out-dir', help='work dirs of the cells and the results '
                        '(default: work_dirs/suites/<suite file name>)')
    parser.add_argument('--launcher', choices=LAUNCHERS, default='none', help='how each cell is started')
    parser.add_argument('--jobs', type=int, default=1, help='cells at a time (default: 1)')
    parser.add_argument('--nproc', type=int, default=1,
                        help='processes (GPUs) per cell with --launcher pytorch or slurm (default: 1)')
    parser.add_argument('--partition', help='SLURM partition (--launcher slurm)')
    parser.add_argument('--resume', action='store_true',
                        help='reuse finished cells, test trained ones, resume interrupted ones')
    parser.add_argument('--dry-run', action='store_true', help='print the commands, run nothing')
    parser.add_argument('--gather-only', action='store_true', help='run nothing, gather the finished cells')
    parser.add_argument('--cfg-options', nargs='+', default=[], metavar='KEY=VALUE',
                        help="overrides for every cell, as tools/train.py's (applied last)")
    args = parser.parse_args(argv)
    if args.jobs < 1 or args.nproc < 1:
        parser.error('--jobs and --nproc must be positive')
    if args.launcher == 'slurm' and not args.partition and not args.gather_only:
        parser.error('--launcher slurm needs --partition')
    if args.launcher == 'none' and args.nproc != 1:
        parser.error('--nproc is for --launcher pytorch or slurm; --launcher none runs one process per cell')
    if args.out_dir is None:
        args.out_dir = osp.join('work_dirs', 'suites', osp.splitext(osp.basename(args.suite))[0])
    args.out_dir = osp.abspath(args.out_dir)
    return args


def print_commands(cells, args):
    for cell in cells:
        train, test, env = commands(cell, args, 0, REPO_ROOT)
        prefix = ' '.join(f'{key}={value}' for key, value in env.items())
        print(f'# {cell.variant} lr {cell.lr:g} seed {cell.seed}\n{prefix} {shlex.join(train)}\n'
              f'{prefix} {shlex.join(test)}')


def run_phase(suite, phase, new, args):
    """Run the phase's cells that are not finished (none with --gather-only); returns (ran, reused)."""
    states = {id(cell): cell_state(cell) for cell in new}
    if not args.resume and not args.gather_only:
        started = [cell for cell in new if states[id(cell)] != 'new' or osp.isdir(cell.work_dir)]
        if started:
            sys.exit(f'error: {len(started)} cell(s) of {suite.name} already exist under {args.out_dir} '
                     f'(e.g. {started[0].work_dir}); use --resume to continue them (finished cells are '
                     'kept) or another --out-dir')
    pending = [cell for cell in new if states[id(cell)] != 'finished']
    for cell in new:
        if states[id(cell)] == 'finished':
            cell.status = 'reused'
        elif args.gather_only:
            cell.status = 'missing'
    ran = 0
    if not args.gather_only and pending:
        run_pending(pending, args, REPO_ROOT, f'{suite.name} phase {phase}')
        ran = len(pending)
    for cell in new:
        cell.results = cell_results(cell)
    return ran, len(new) - len(pending)


def main(argv=None):
    args = parse_args(argv)
    try:
        suite = load_suite(args.suite, REPO_ROOT)
    except SuiteError as error:
        sys.exit(f'error: {error}')
    phases = phase_of(suite)
    command = 'python ' + shlex.join([osp.relpath(osp.abspath(__file__), REPO_ROOT), *(argv or sys.argv[1:])])
    cells, start, ran, reused = [], time.perf_counter(), 0, 0
    for phase in range(max(phases.values()) + 1):
        try:
            new = cells_of_phase(suite, phase, phases, cells, args.out_dir, args.cfg_options)
        except SuiteError as error:
            if args.dry_run:
                print(f'# phase {phase}: {error} (a dry run trains nothing)')
                break
            sys.exit(f'error: {error}')
        if args.dry_run:
            print_commands(new, args)
        else:
            phase_ran, phase_reused = run_phase(suite, phase, new, args)
            ran, reused = ran + phase_ran, reused + phase_reused
        cells += new
    if args.dry_run:
        return
    rows, best = aggregate(suite, cells)
    result = summary_of(suite, cells, rows, best, dict(
        command=command, launcher=args.launcher, jobs=args.jobs, nproc=args.nproc, ran=ran, reused=reused,
        wall_s=time.perf_counter() - start, machine=describe_machine()))
    os.makedirs(args.out_dir, exist_ok=True)
    paths = {name: osp.join(args.out_dir, name) for name in REPORT_FILES}
    table = write_tables(suite, result, args.out_dir)
    plot(suite, cells, rows, best, paths)
    print('\n' + table)
    print('wrote ' + ', '.join(paths.values()))
    failed = [cell for cell in cells if cell.status in ('failed', 'missing')]
    if failed:
        sys.exit(f'error: {len(failed)} of {len(cells)} cells did not finish: '
                 + '; '.join(f'{c.variant} lr {c.lr:g} seed {c.seed} ({c.status}, {c.work_dir})' for c in failed))


if __name__ == '__main__':
    main()
