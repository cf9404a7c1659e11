"""Run a study suite: every (variant, learning rate, seed) cell of a suite file through tools/train.py and
tools/test.py, on this machine or a cluster, and gather the results.

    python tools/suites/run_suite.py SUITE [--out-dir DIR] [--launcher none|pytorch|slurm] [--jobs N]
        [--nproc N] [--partition P] [--resume [--rerun-changed]] [--accept-unfingerprinted] [--dry-run]
        [--gather-only] [--cfg-options KEY=VALUE ...]

A suite is an mmengine config file (configs/suites/*.py, may ``_base_`` another) with the keys (the full
list: condtok_mm/suites/schema.py)

    variants = dict(NAME=dict(config=PATH, cfg_options={KEY: VALUE}, lrs=None | [LR, ...] | dict(best_of=NAME),
                              reference=NAME | None, description=TEXT), ...)
    reference = NAME; seeds = [3, 4, 5]; selection_seeds = [0, 1, 2]; lrs = [LR, ...]; family = [NAME, ...]
    lr_key = 'optim_wrapper.optimizer.lr'; metric = 'coco/bbox_mAP'; cfg_options = {KEY: VALUE}

A variant's config is a path relative to the repository root or PACKAGE::PATH of an installed mmdet, mmpretrain
or mmseg. A variant with several rates is reported at the one with the best mean ``metric``: chosen on
``selection_seeds`` (every rate runs there, the chosen one on ``seeds``), or, without them, on the reported
seeds themselves (the report says so). ``lrs=dict(best_of=NAME)`` takes NAME's chosen rate. Every cell trains
in OUT_DIR/VARIANT/lrLR/seedS (train.log there) with ``randomness.seed=S``, the learning rate at ``lr_key``,
the suite's, the variant's and then this command's --cfg-options; then tools/test.py evaluates its final
checkpoint into OUT_DIR/VARIANT/lrLR/seedS/test (test.log there). A failed cell does not stop the others: its
log tail is printed and the runner exits with 1; so does a cell with a cut-off or unreadable file (named, with
the fix), which no table reads. A resumed cell's curves join every training run of its work dir.

Launchers (condtok_mm/suites/launch.py): none (tools/train.py, tools/test.py, --jobs cells at a time),
pytorch (tools/dist_train.sh / dist_test.sh, --nproc processes a cell), slurm (tools/slurm_train.sh /
slurm_test.sh, GPUS=--nproc).

Each cell records its fingerprint (resolved config, options, seed, rate, condtok_mm version, the SHA-256 of
the checkpoints and annotation files it reads) in WORK_DIR/suite_cell.json when it starts. --resume reuses finished cells, tests trained ones and resumes
interrupted ones from their last checkpoint, each only when its fingerprint is this suite's; a cell that
differs stops the runner with its name and what differs (--rerun-changed sets it aside to WORK_DIR.changed-N
and runs it again), and so does a cell that records none (--accept-unfingerprinted uses it as it is, and
suite.md names it). A cell whose loss diverged and whose test ended without a result, kept by
save_suite_records.py without its checkpoint, is named and not run (set its work dir aside to train it again).
Without --resume the runner refuses an OUT_DIR that already holds cells. --gather-only
runs nothing and gathers the finished cells (checked the same way). --dry-run prints the commands. SIGINT or
SIGTERM stops the running cells (each command runs in its own process group) and exits with 130; --resume
continues them. So does an interrupt while the report is written: each file of the report is replaced whole.

Writes to OUT_DIR: suite.md (every rate on the selection seeds, or on the seeds in a suite without them; each
variant at its chosen rate on the reported seeds; the validations during training), with means, per-seed
values, paired differences to each variant's reference (95 % t interval, exact sign-flip p, Holm over the
family), final loss, plateau escapes, divergences and failures; suite.json (every cell's values and curves,
and the aggregates); ap_vs_lr.png; seeds.png (each reported seed's metric across the variants, and the
validations during training); loss.png and kappa.png (loss and kappa curves at each variant's chosen rate,
where the configs record kappa); and prints the tables. Each is written under a temporary name and renamed, so
that a reader, or a run stopped meanwhile, finds it whole.
"""
import argparse
import os
import os.path as osp
import shlex
import signal
import sys
import time

from condtok_mm.utils import describe_machine
from condtok_mm.utils.package_files import package_root
from .fingerprint import FINGERPRINT_FILE, cell_record, differences, fingerprint, recorded_fingerprint, set_aside
from .launch import LAUNCHERS, commands, foreign_package, run_pending
from .plan import STAGES, cells_of_stage
from .plots import plot
from .report import REPORT_FILES, summary_of, write_tables
from .results import UnreadableCellFile, cell_results, cell_state, diverged_untestable, unreadable_results
from .schema import SuiteError, load_suite, phase_of


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
    parser.add_argument('--rerun-changed', action='store_true',
                        help='with --resume: set aside the cells whose fingerprint differs from the suite\'s and run '
                        'them again (without it the runner stops naming them)')
    parser.add_argument('--accept-unfingerprinted', action='store_true',
                        help='reuse cells that record no fingerprint (run before the runner recorded them) as they '
                        'are; suite.md names them')
    parser.add_argument('--dry-run', action='store_true', help='print the commands, run nothing')
    parser.add_argument('--gather-only', action='store_true', help='run nothing, gather the finished cells')
    parser.add_argument('--cfg-options', nargs='+', default=[], metavar='KEY=VALUE',
                        help="overrides for every cell, as tools/train.py's (applied last)")
    args = parser.parse_args(argv)
    if args.jobs < 1 or args.nproc < 1:
        parser.error('--jobs and --nproc must be positive')
    if args.launcher == 'slurm' and not args.partition and not args.gather_only:
        parser.error('--launcher slurm needs --partition')
    if args.rerun_changed and not args.resume:
        parser.error('--rerun-changed is for --resume (it reruns the changed cells of a suite run)')
    if args.launcher == 'none' and args.nproc != 1:
        parser.error('--nproc is for --launcher pytorch or slurm; --launcher none runs one process per cell')
    if args.out_dir is None:
        args.out_dir = osp.join('work_dirs', 'suites', osp.splitext(osp.basename(args.suite))[0])
    args.out_dir = osp.abspath(args.out_dir)
    return args


def print_commands(cells, args):
    for cell in cells:
        train, test, env = commands(cell, args, 0, args.root)
        prefix = ' '.join(f'{key}={value}' for key, value in env.items())
        print(f'# {cell.variant} lr {cell.lr:g} seed {cell.seed}\n{prefix} {shlex.join(train)}\n'
              f'{prefix} {shlex.join(test)}')


def reusable(suite, new, states, args):
    """Check the fingerprint of every cell that has a work dir against the one it records; stop naming the
    cells that differ (or set them aside with --rerun-changed) and those that record none (unless
    --accept-unfingerprinted). Returns the cells accepted without a fingerprint and {id(cell): the file and the
    fix} of those whose record cannot be read (neither run nor gathered: nothing says which cell they are)."""
    changed, unrecorded, unreadable = [], [], {}
    for cell in new:
        if states[id(cell)] == 'new' and not osp.isdir(cell.work_dir):
            continue
        try:
            recorded = recorded_fingerprint(cell)
        except UnreadableCellFile as error:
            unreadable[id(cell)] = str(error)
            continue
        if recorded is None:
            unrecorded.append(cell)
        elif recorded != cell.fingerprint:
            changed.append((cell, differences(recorded, cell.fingerprint)))
    problems = []
    if changed and not args.rerun_changed:
        problems += [f'cell {describe(cell)} ({cell.work_dir}) is not the cell this suite asks for:\n    '
                     + '\n    '.join(lines) for cell, lines in changed]
    if unrecorded and not args.accept_unfingerprinted:
        problems += [f'cell {describe(cell)} ({cell.work_dir}) records no fingerprint ({FINGERPRINT_FILE}): it '
                     'was not started by this runner, or by one from before fingerprints' for cell in unrecorded]
    if problems:
        fixes = []
        if changed and not args.rerun_changed:
            fixes.append('--resume --rerun-changed sets the changed cells aside and runs them again')
        if unrecorded and not args.accept_unfingerprinted:
            fixes.append('--accept-unfingerprinted uses the cells that record none as they are')
        sys.exit(f'error: {len(problems)} cell(s) under {args.out_dir} are not those of {suite.name}:\n'
                 + '\n'.join(problems) + f'\n({"; ".join(fixes)}; or give another --out-dir)')
    for cell, _ in changed:
        print(f'{describe(cell)} changed: set aside to {set_aside(cell)}; it runs again')
        states[id(cell)] = 'new'
    return unrecorded, unreadable


def describe(cell):
    return f'{cell.variant} lr {cell.lr:g} seed {cell.seed}'


def untestable_here(cell, state, suite):
    """Whether ``cell`` (of ``suite``, whose escape rule its results are read with; ``state``: its
    :func:`~condtok_mm.suites.results.cell_state`) is one whose loss diverged and whose test ended without a result
    (:func:`~condtok_mm.suites.results.diverged_untestable`) and whose checkpoint is not here to test again (its
    saved records, copied back): training it again from the start would overwrite that record with another run,
    on another machine perhaps, where the study's rule may count it as it is (test AP 0)."""
    return (state == 'new' and osp.isdir(cell.work_dir)
            and diverged_untestable(cell_results(cell, suite.escape), cell_record(cell)))


def run_step(suite, step, new, args):
    """Run the step's cells that are not finished (none with --gather-only), except a diverged cell that its test
    could not score and that has no checkpoint here (:func:`untestable_here`: named, not run, failed); returns
    (ran, reused, cells accepted without a fingerprint)."""
    states = {id(cell): cell_state(cell) for cell in new}
    if not args.resume and not args.gather_only:
        started = [cell for cell in new if states[id(cell)] != 'new' or osp.isdir(cell.work_dir)]
        if started:
            sys.exit(f'error: {len(started)} cell(s) of {suite.name} already exist under {args.out_dir} '
                     f'(e.g. {started[0].work_dir}); use --resume to continue them (finished cells are '
                     'kept) or another --out-dir')
    for cell in new:
        cell.fingerprint = fingerprint(cell, args.root)
    unrecorded, unreadable = reusable(suite, new, states, args)
    untestable = {id(cell) for cell in new
                  if id(cell) not in unreadable and untestable_here(cell, states[id(cell)], suite)}
    pending = [cell for cell in new if states[id(cell)] != 'finished' and id(cell) not in unreadable
               and id(cell) not in untestable]
    for cell in new:
        if states[id(cell)] == 'finished':
            cell.status = 'reused'
        elif args.gather_only:
            cell.status = 'missing'
        elif id(cell) in untestable:
            cell.status = 'failed'
            print(f'cell {describe(cell)}: its loss diverged and its test ended without a result on its final '
                  f'checkpoint ({osp.join(cell.work_dir, "test.log")}), which is not here to test again: not run; '
                  'set its work dir aside to train it again', file=sys.stderr)
    ran = 0
    if not args.gather_only and pending:
        run_pending(pending, args, args.root, f'{suite.name} {step}')
        ran = len(pending)
    for cell in new:
        cell.results = (unreadable_results(unreadable[id(cell)]) if id(cell) in unreadable else
                        cell_results(cell, suite.escape))
        if 'unreadable' in cell.results:  # the others are gathered; this one is named at the end
            cell.status = 'unreadable'
            print(f'cell {describe(cell)}: {cell.results["unreadable"]}', file=sys.stderr)
    return ran, len(new) - len(pending), unrecorded


def interrupt(signum, frame):
    """SIGTERM (a scheduler's stop, `kill`) ends the runner as SIGINT does: its running cells are stopped."""
    raise KeyboardInterrupt


def run_phases(suite, args):
    """The cells of every phase and stage, run or reused (printed with --dry-run); (cells, ran, reused,
    unverified)."""
    phases = phase_of(suite)
    cells, ran, reused, unverified = [], 0, 0, []
    for phase in range(max(phases.values()) + 1):
        for stage in STAGES:
            new, unknown = cells_of_stage(suite, phase, stage, phases, cells, args.out_dir, args.cfg_options)
            if unknown and not args.dry_run:
                sys.exit('error: ' + '; '.join(unknown))
            if args.dry_run:
                print_commands(new, args)
                print(''.join(f'# phase {phase} {stage}: {line} (a dry run trains nothing)\n' for line in unknown),
                      end='')
            elif new:
                step_ran, step_reused, step_unverified = run_step(suite, f'phase {phase} {stage}', new, args)
                ran, reused, unverified = ran + step_ran, reused + step_reused, unverified + step_unverified
            cells += new
    return cells, ran, reused, unverified


def write_report(suite, cells, run, out_dir):
    """suite.json, suite.md and the figures of the gathered ``cells`` in ``out_dir``, each replaced whole; prints
    the tables. ``run``: how the cells were run (report.summary_of)."""
    result = summary_of(suite, cells, run)
    os.makedirs(out_dir, exist_ok=True)
    paths = {name: osp.join(out_dir, name) for name in REPORT_FILES}
    table = write_tables(suite, result, out_dir)
    plot(suite, cells, result['rows'], result['best'], result['validation'], paths)
    print('\n' + table)
    print('wrote ' + ', '.join(paths.values()))


def interrupted(args, reporting):
    """What an interrupt (Ctrl-C, SIGTERM) left and how to go on: while the cells ran, or while the report was
    written (``reporting``)."""
    if not reporting:
        return (f'interrupted: the running cells were stopped; the same command with --resume continues them '
                f'({args.out_dir})')
    again = 'the same command' if args.resume or args.gather_only else 'the same command with --resume'
    return (f'interrupted while writing the report: the cells are finished, and each of {", ".join(REPORT_FILES)} '
            f'in {args.out_dir} is whole (its previous version or the new one); {again} writes them again')


def main(argv=None, root=None):
    """Run (or gather) the suite that the command line ``argv`` names.

    Args:
        argv (list[str], optional): the arguments (default: ``sys.argv[1:]``).
        root (str, optional): the checkout (or condtok_mm/.mim) whose configs/ and tools/ the cells use, whose
            condtok_mm they import and whose commit their records name: tools/suites/run_suite.py passes its own
            (default: the imported package's).
    """
    args = parse_args(argv)
    args.root = root or package_root()
    mixed = foreign_package(args.root)
    if mixed:
        sys.exit(f'error: {mixed}')
    command = 'python ' + shlex.join(['tools/suites/run_suite.py', *(argv or sys.argv[1:])])
    start = time.perf_counter()
    previous = signal.signal(signal.SIGTERM, interrupt)
    reporting = False
    try:
        try:
            suite = load_suite(args.suite, args.root)
        except SuiteError as error:
            sys.exit(f'error: {error}')
        cells, ran, reused, unverified = run_phases(suite, args)
        if args.dry_run:
            return
        reporting = True
        write_report(suite, cells, dict(
            command=command, launcher=args.launcher, jobs=args.jobs, nproc=args.nproc, ran=ran, reused=reused,
            wall_s=time.perf_counter() - start, machine=describe_machine(),
            unfingerprinted=[cell.work_dir for cell in unverified]), args.out_dir)
    except UnreadableCellFile as error:
        sys.exit(f'error: {error}')
    except KeyboardInterrupt:
        print(interrupted(args, reporting), file=sys.stderr)
        sys.exit(130)
    finally:
        signal.signal(signal.SIGTERM, previous)
    failed = [cell for cell in cells if cell.status in ('failed', 'missing', 'unreadable')]
    if failed:
        sys.exit(f'error: {len(failed)} of {len(cells)} cells did not finish: '
                 + '; '.join(f'{describe(c)} ({c.status}, {(c.results or {}).get("unreadable") or c.work_dir})'
                             for c in failed))


if __name__ == '__main__':
    main()
