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
import glob
import json
import math
import os
import os.path as osp
import shlex
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed

from mmengine.config import Config, ConfigDict
from scipy import stats
from tqdm import tqdm

REPO_ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
sys.path.insert(0, REPO_ROOT)  # run from a checkout, installed or not
from condtok_mm.utils import describe_machine, usable_cpus  # noqa: E402

LAUNCHERS = ('none', 'pytorch', 'slurm')
REPORTED_METRICS = {'coco/bbox_mAP': 'bbox AP', 'coco/segm_mAP': 'segm AP'}  # fractions; reported in percent
# A run "plateaued" when its final training loss is still at least this fraction of the loss it logged at a
# quarter of the run: the demo baseline that stalls keeps its loss of iteration ~150 to the end.
PLATEAU_FRACTION = 0.9
LOG_TAIL_LINES = 25
# kappa curves drawn from the AttentionConditioningHook's records, where a config has the hook: the tokens
# entering the first block, and the first attention's input (what it multiplies).
KAPPA_CURVES = {
    'kappa/tokens_out_mean/stage0': 'tokens entering the first block',
    'kappa/attn_input_mean/stage0': "the first attention's input (norm1 output, per window)",
}
SUITE_KEYS = {'variants', 'reference', 'seeds', 'lrs', 'lr_key', 'metric', 'cfg_options', 'description'}
VARIANT_KEYS = {'config', 'cfg_options', 'lrs', 'description'}


class SuiteError(ValueError):
    """A suite file that cannot be run; the message names the key and the fix."""


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


def option_value(key, value, where):
    """A --cfg-options value as mmengine's DictAction reads it back."""
    if isinstance(value, (list, tuple)):
        return '[' + ','.join(option_value(key, item, where) for item in value) + ']'
    if isinstance(value, (dict, ConfigDict)):
        raise SuiteError(f'{where}: {key} is a dict; give its keys one by one ({key}.SUBKEY: VALUE)')
    if isinstance(value, str) and any(char in value for char in ',[]()" '):
        raise SuiteError(f'{where}: the value of {key} ({value!r}) has characters that --cfg-options cannot '
                         'carry; set it in the variant config instead')
    return str(value)


def options_list(options, where):
    if not isinstance(options, (dict, ConfigDict)):
        raise SuiteError(f'{where}: cfg_options must be a dict of KEY: VALUE, got {type(options).__name__}')
    return [f'{key}={option_value(key, value, where)}' for key, value in options.items()]


def load_suite(path):
    """The suite file as a checked dict; raises SuiteError naming what is wrong."""
    if not osp.isfile(path):
        raise SuiteError(f'no suite file at {path}; suites live in configs/suites/')
    raw = {key: value for key, value in Config.fromfile(path, import_custom_modules=False).to_dict().items()
           if not key.startswith('_')}  # _name: the suite file's own shorthands
    unknown = set(raw) - SUITE_KEYS
    if unknown:
        raise SuiteError(f'{path}: unknown key(s) {", ".join(sorted(unknown))}; a suite has '
                         f'{", ".join(sorted(SUITE_KEYS))}')
    for key in ('variants', 'reference', 'seeds'):
        if key not in raw:
            raise SuiteError(f'{path}: the suite has no {key!r}')
    suite = dict(path=path, name=osp.splitext(osp.basename(path))[0], reference=raw['reference'],
                 seeds=list(raw['seeds']), lrs=list(raw.get('lrs') or []),
                 lr_key=raw.get('lr_key', 'optim_wrapper.optimizer.lr'),
                 metric=raw.get('metric', 'coco/bbox_mAP'), description=raw.get('description', ''),
                 options=options_list(raw.get('cfg_options', {}), f'{path}: cfg_options'), variants={})
    if not suite['seeds'] or not all(isinstance(seed, int) for seed in suite['seeds']):
        raise SuiteError(f'{path}: seeds must be a non-empty list of integers, got {raw["seeds"]!r}')
    if not isinstance(raw['variants'], dict) or not raw['variants']:
        raise SuiteError(f'{path}: variants must be a non-empty dict of NAME=dict(config=..., ...)')
    for name, variant in raw['variants'].items():
        where = f'{path}: variant {name!r}'
        if not isinstance(variant, dict) or 'config' not in variant:
            raise SuiteError(f'{where} needs a config: dict(config=PATH, ...)')
        unknown = set(variant) - VARIANT_KEYS
        if unknown:
            raise SuiteError(f'{where}: unknown key(s) {", ".join(sorted(unknown))}; a variant has '
                             f'{", ".join(sorted(VARIANT_KEYS))}')
        config = variant['config']
        if not config.startswith('mmdet::') and not osp.isfile(osp.join(REPO_ROOT, config)):
            raise SuiteError(f'{where}: config {config} does not exist (paths are relative to the repository root)')
        lrs = variant.get('lrs')
        if lrs is None:
            if not suite['lrs']:
                raise SuiteError(f'{where} has no lrs and the suite has no lrs')
            lrs = suite['lrs']
        elif isinstance(lrs, dict):
            if set(lrs) != {'best_of'} or lrs['best_of'] not in raw['variants'] or lrs['best_of'] == name:
                raise SuiteError(f'{where}: lrs=dict(best_of=NAME) needs NAME, another variant of the suite; '
                                 f'got {lrs!r}')
        elif not (isinstance(lrs, list) and lrs and all(isinstance(lr, (int, float)) and lr > 0 for lr in lrs)):
            raise SuiteError(f'{where}: lrs must be None, a list of positive rates or dict(best_of=NAME)')
        suite['variants'][name] = dict(config=config, lrs=lrs, description=variant.get('description', ''),
                                       options=options_list(variant.get('cfg_options', {}),
                                                            f'{where}: cfg_options'))
    if suite['reference'] not in suite['variants']:
        raise SuiteError(f'{path}: reference {suite["reference"]!r} is not one of the variants '
                         f'({", ".join(suite["variants"])})')
    phase_of(suite)  # a best_of cycle fails here
    return suite


def phase_of(suite):
    """{variant: phase}: 0 for fixed rates, 1 + the phase of the variant whose best rate it takes."""
    phases = {}

    def phase(name, seen=()):
        if name in seen:
            raise SuiteError(f'{suite["path"]}: best_of cycle {" -> ".join((*seen, name))}')
        if name not in phases:
            lrs = suite['variants'][name]['lrs']
            phases[name] = 1 + phase(lrs['best_of'], (*seen, name)) if isinstance(lrs, dict) else 0
        return phases[name]

    for name in suite['variants']:
        phase(name)
    return phases


def lr_name(lr):
    return f'lr{lr:g}'


def make_cell(suite, variant, lr, seed, args):
    work_dir = osp.join(args.out_dir, variant, lr_name(lr), f'seed{seed}')
    options = [f'randomness.seed={seed}', f'{suite["lr_key"]}={lr!r}', *suite['options'],
               *suite['variants'][variant]['options'], *args.cfg_options]
    return dict(variant=variant, lr=lr, seed=seed, work_dir=work_dir, options=options,
                config=suite['variants'][variant]['config'])


def final_checkpoint(cell):
    """The checkpoint the cell's training ends with, from its resolved config (epoch- or iteration-based)."""
    from mmengine.config import DictAction
    parser = argparse.ArgumentParser()
    parser.add_argument('--cfg-options', nargs='+', action=DictAction)
    cfg = Config.fromfile(osp.join(REPO_ROOT, cell['config']) if not cell['config'].startswith('mmdet::')
                          else cell['config'], import_custom_modules=False)
    cfg.merge_from_dict(parser.parse_args(['--cfg-options', *cell['options']]).cfg_options)
    train_cfg = cfg.train_cfg
    if 'max_epochs' in train_cfg and train_cfg.get('by_epoch', True) and 'max_iters' not in train_cfg:
        return osp.join(cell['work_dir'], f'epoch_{train_cfg.max_epochs}.pth')
    return osp.join(cell['work_dir'], f'iter_{train_cfg.max_iters}.pth')


def tool(name):
    return osp.join(REPO_ROOT, 'tools', name)


def commands(cell, args, slot):
    """(train command, test command, extra environment) of a cell under the chosen launcher."""
    config = osp.join(REPO_ROOT, cell['config']) if not cell['config'].startswith('mmdet::') else cell['config']
    test_dir = osp.join(cell['work_dir'], 'test')
    options = ['--cfg-options', *cell['options']]
    resume = ['--resume'] if cell.get('resume') else []
    checkpoint = cell['checkpoint']
    if args.launcher == 'none':
        threads = str(max(1, usable_cpus() // args.jobs))
        env = dict(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads)
        train = [sys.executable, tool('train.py'), config, '--work-dir', cell['work_dir'], *resume, *options]
        test = [sys.executable, tool('test.py'), config, checkpoint, '--work-dir', test_dir, *options]
    elif args.launcher == 'pytorch':
        threads = str(max(1, usable_cpus() // (args.jobs * args.nproc)))
        env = dict(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads, PORT=str(29500 + slot),
                   PYTHON=sys.executable)
        train = ['bash', tool('dist_train.sh'), config, str(args.nproc), '--work-dir', cell['work_dir'], *resume,
                 *options]
        test = ['bash', tool('dist_test.sh'), config, checkpoint, str(args.nproc), '--work-dir', test_dir, *options]
    else:
        job = f'{cell["variant"]}-{lr_name(cell["lr"])}-seed{cell["seed"]}'
        env = dict(GPUS=str(args.nproc), GPUS_PER_NODE=str(min(args.nproc, 8)), PYTHON=sys.executable)
        train = ['bash', tool('slurm_train.sh'), args.partition, job, config, cell['work_dir'], *resume, *options]
        test = ['bash', tool('slurm_test.sh'), args.partition, job, config, checkpoint, '--work-dir', test_dir,
                *options]
    return train, test, env


def newest(pattern):
    files = sorted(glob.glob(pattern))
    return files[-1] if files else None


def evaluation(cell):
    """The metrics tools/test.py logged for the cell (mmengine's <timestamp>.json of the newest test run)."""
    path = newest(osp.join(cell['work_dir'], 'test', '*', '*.json'))
    if path is None:
        return None
    with open(path) as f:
        record = json.load(f)  # mmengine's LoggerHook dumps the test epoch's tags as one JSON object
    return (path, record) if any(key.startswith('coco/') for key in record) else None


def cell_state(cell):
    if evaluation(cell):
        return 'finished'
    if osp.isfile(cell['checkpoint']):
        return 'trained'
    if osp.isfile(osp.join(cell['work_dir'], 'last_checkpoint')):
        return 'interrupted'
    return 'new'


def run_logged(command, log_path, env):
    with open(log_path, 'a') as log:
        log.write('$ ' + shlex.join(command) + '\n\n')
        log.flush()
        return subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT,
                              env=dict(os.environ, **env)).returncode


def run_cell(cell, args, slot):
    """Train (or resume) and test one cell; returns the cell with its status and wall time."""
    os.makedirs(cell['work_dir'], exist_ok=True)
    start = time.perf_counter()
    state = cell_state(cell)
    cell['resume'] = state == 'interrupted'
    train, test, env = commands(cell, args, slot)
    cell['log'] = osp.join(cell['work_dir'], 'train.log')
    returncode = 0
    if state in ('new', 'interrupted'):
        returncode = run_logged(train, cell['log'], env)
    if returncode == 0:
        cell['log'] = osp.join(cell['work_dir'], 'test.log')
        returncode = run_logged(test, cell['log'], env)
    cell.update(returncode=returncode, wall_s=time.perf_counter() - start,
                status='ran' if returncode == 0 and evaluation(cell) else 'failed')
    return cell


def log_tail(path):
    if not osp.isfile(path):
        return '(no log)'
    with open(path, errors='replace') as f:
        return ''.join(f.readlines()[-LOG_TAIL_LINES:])


def training_record(work_dir):
    """(path, iterations, losses, {kappa key: curve}) of the newest training run's vis_data/scalars.json
    (mmengine's LocalVisBackend: one JSON record a line; the hook's kappa records carry their iteration as
    'step')."""
    path = newest(osp.join(work_dir, '2*', 'vis_data', 'scalars.json'))
    iters, losses, kappa = [], [], {key: dict(iter=[], value=[]) for key in KAPPA_CURVES}
    if path:
        with open(path) as f:
            for line in f:
                record = json.loads(line)
                if 'loss' in record and 'iter' in record:
                    iters.append(record['iter'])
                    losses.append(record['loss'])
                for key in KAPPA_CURVES:
                    if key in record:
                        kappa[key]['iter'].append(record['step'])
                        kappa[key]['value'].append(record[key])
    return path, iters, losses, kappa


def cell_results(cell):
    """Metrics (percent), final loss, loss curve and the plateau/divergence flags of a cell."""
    found = evaluation(cell)
    scalars, iters, losses, kappa = training_record(cell['work_dir'])
    results = dict(scalars=scalars, loss=dict(iter=iters, value=losses), kappa=kappa,
                   diverged=any(not math.isfinite(loss) for loss in losses))
    if cell.get('status') == 'failed':
        tail = log_tail(cell.get('log', osp.join(cell['work_dir'], 'train.log'))).lower()
        results['diverged'] = results['diverged'] or 'non-finite' in tail or 'nan' in tail.split()
    if found:
        path, record = found
        results.update(evaluation=path, metrics={key: 100 * value for key, value in record.items()
                                                 if key.startswith('coco/') and isinstance(value, (int, float))})
    if losses:
        quarter = min(range(len(iters)), key=lambda i: abs(iters[i] - iters[-1] / 4))
        results.update(final_loss=losses[-1], plateaued=losses[-1] >= PLATEAU_FRACTION * losses[quarter])
    return results


def mean_std(values):
    return dict(mean=statistics.fmean(values), std=statistics.stdev(values) if len(values) > 1 else None,
                n=len(values))


def paired_difference(values, reference):
    """Mean of the per-seed differences values - reference and its 95 % t interval (None below 2 seeds)."""
    seeds = sorted(set(values) & set(reference))
    if not seeds:
        return None
    differences = [values[seed] - reference[seed] for seed in seeds]
    mean = statistics.fmean(differences)
    if len(differences) < 2:
        return dict(mean=mean, low=None, high=None, n=1, seeds=seeds)
    half = stats.t.ppf(0.975, len(differences) - 1) * statistics.stdev(differences) / math.sqrt(len(differences))
    return dict(mean=mean, low=mean - half, high=mean + half, n=len(differences), seeds=seeds)


def metric_by_seed(cells, variant, lr, metric):
    return {cell['seed']: cell['results']['metrics'][metric] for cell in cells
            if cell['variant'] == variant and cell['lr'] == lr and metric in cell['results'].get('metrics', {})}


def best_lr(cells, variant, metric):
    """The variant's rate with the best mean metric over its seeds (None while none finished)."""
    by_lr = {}
    for cell in cells:
        if cell['variant'] == variant and metric in cell.get('results', {}).get('metrics', {}):
            by_lr.setdefault(cell['lr'], []).append(cell['results']['metrics'][metric])
    return max(by_lr, key=lambda lr: statistics.fmean(by_lr[lr])) if by_lr else None


def aggregate(suite, cells):
    reference, metric = suite['reference'], suite['metric']
    metrics = [metric] + [key for key in REPORTED_METRICS if key != metric]
    rows = []
    for variant in suite['variants']:
        for lr in sorted({cell['lr'] for cell in cells if cell['variant'] == variant}):
            group = [cell for cell in cells if cell['variant'] == variant and cell['lr'] == lr]
            done = [cell for cell in group if 'metrics' in cell['results']]
            row = dict(variant=variant, lr=lr, seeds=sorted(cell['seed'] for cell in done),
                       failed=sorted(cell['seed'] for cell in group if cell.get('status') == 'failed'),
                       plateaued=sorted(cell['seed'] for cell in group if cell['results'].get('plateaued')),
                       diverged=sorted(cell['seed'] for cell in group if cell['results'].get('diverged')),
                       metrics={}, difference={})
            for key in metrics:
                values = metric_by_seed(cells, variant, lr, key)
                if values:
                    row['metrics'][key] = mean_std(list(values.values()))
                    if variant != reference:
                        row['difference'][key] = paired_difference(values, metric_by_seed(cells, reference, lr, key))
            losses = [cell['results']['final_loss'] for cell in done if 'final_loss' in cell['results']]
            row['final_loss'] = mean_std(losses) if losses else None
            rows.append(row)
    best = []
    reference_lr = best_lr(cells, reference, metric)
    for variant in suite['variants']:
        lr = best_lr(cells, variant, metric)
        if lr is None:
            continue
        row = next(row for row in rows if row['variant'] == variant and row['lr'] == lr)
        entry = dict(variant=variant, lr=lr, metrics=row['metrics'], final_loss=row['final_loss'],
                     reference_lr=reference_lr, difference={})
        if variant != reference and reference_lr is not None:
            for key in row['metrics']:
                entry['difference'][key] = paired_difference(metric_by_seed(cells, variant, lr, key),
                                                             metric_by_seed(cells, reference, reference_lr, key))
        best.append(entry)
    return rows, best


def fmt(stat, digits=1):
    if stat is None:
        return 'n/a'
    if stat['std'] is None:
        return f'{stat["mean"]:.{digits}f}'
    return f'{stat["mean"]:.{digits}f} ± {stat["std"]:.{digits}f}'


def fmt_difference(difference):
    if difference is None:
        return 'n/a'
    if difference['low'] is None:
        return f'{difference["mean"]:+.1f} (1 seed)'
    return f'{difference["mean"]:+.1f} [{difference["low"]:+.1f}, {difference["high"]:+.1f}]'


def seeds_text(seeds):
    return ', '.join(str(seed) for seed in seeds) if seeds else '-'


def markdown(suite, rows, best, summary):
    reference, metric = suite['reference'], suite['metric']
    keys = [metric] + [key for key in REPORTED_METRICS if key != metric]
    names = [REPORTED_METRICS.get(key, key) for key in keys]
    lines = [f'| variant | lr | seeds | {" | ".join(names)} | Δ {names[0]} vs {reference} (same lr) | '
             f'Δ {names[1] if len(names) > 1 else names[0]} vs {reference} | final loss | plateaued | '
             'diverged | failed |',
             '|---|---|---|' + '---|' * len(names) + '---|---|---|---|---|---|']
    for row in rows:
        differences = [fmt_difference(row['difference'].get(key)) if row['variant'] != reference else '—'
                       for key in keys[:2]]
        lines.append(f'| {row["variant"]} | {row["lr"]:g} | {seeds_text(row["seeds"])} | '
                     + ' | '.join(fmt(row['metrics'].get(key)) for key in keys) + ' | '
                     + ' | '.join(differences) + f' | {fmt(row["final_loss"], 3)} | '
                     f'{seeds_text(row["plateaued"])} | {seeds_text(row["diverged"])} | {seeds_text(row["failed"])} |')
    lines += ['', f'Best learning rate of each variant (by mean {REPORTED_METRICS.get(metric, metric)}); Δ: paired '
              f'by seed against {reference} at its own best rate:', '',
              f'| variant | best lr | {" | ".join(names)} | Δ {names[0]} vs {reference} | '
              f'Δ {names[1] if len(names) > 1 else names[0]} vs {reference} | final loss |',
              '|---|---|' + '---|' * len(names) + '---|---|---|']
    for entry in best:
        differences = [fmt_difference(entry['difference'].get(key)) if entry['variant'] != reference else '—'
                       for key in keys[:2]]
        lines.append(f'| {entry["variant"]} | {entry["lr"]:g} | '
                     + ' | '.join(fmt(entry['metrics'].get(key)) for key in keys) + ' | '
                     + ' | '.join(differences) + f' | {fmt(entry["final_loss"], 3)} |')
    machine = summary['machine']
    lines += ['', f'AP in percent (mmdet CocoMetric), mean ± sample std over seeds; Δ: mean of the per-seed '
              f'differences [95 % t interval over seeds]. Final loss: the training loss logged last (mmengine\'s '
              f'running mean). Plateaued: final loss ≥ {PLATEAU_FRACTION:g} × the loss logged at a quarter of the '
              f'run. Diverged: a non-finite loss, or a failure on non-finite values. Cells: '
              f'{summary["cells"]}, {summary["ran"]} run now, {summary["reused"]} reused; wall time '
              f'{summary["wall_s"] / 60:.1f} min on {machine["cpu"]} ({machine["usable_cpus"]} usable CPUs), '
              f'launcher {summary["launcher"]}, {summary["jobs"]} cell(s) at a time. Command: `{summary["command"]}`']
    return '\n'.join(lines) + '\n'


def plot(suite, cells, rows, best, paths):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    metric = suite['metric']
    colours = {variant: f'C{i % 10}' for i, variant in enumerate(suite['variants'])}
    fig, ax = plt.subplots(figsize=(7.5, 4.8), constrained_layout=True)
    for variant in suite['variants']:
        points = [row for row in rows if row['variant'] == variant and metric in row['metrics']]
        if not points:
            continue
        ax.errorbar([row['lr'] for row in points], [row['metrics'][metric]['mean'] for row in points],
                    yerr=[row['metrics'][metric]['std'] or 0 for row in points], fmt='o-', capsize=3,
                    color=colours[variant], label=variant)
    ax.set_xscale('log')
    ax.set_xlabel('learning rate')
    ax.set_ylabel(f'{REPORTED_METRICS.get(metric, metric)} (mean ± std over seeds)')
    ax.set_title(f'{suite["name"]}: {REPORTED_METRICS.get(metric, metric)} against the learning rate', fontsize=10)
    ax.grid(True, which='both', alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    fig.savefig(paths['ap_vs_lr.png'], dpi=120)
    plt.close(fig)

    def draw(ax, curve_of):
        """Each variant's curve at its best rate: mean over seeds, band min-max."""
        for entry in best:
            curves = [curve_of(cell['results']) for cell in cells
                      if cell['variant'] == entry['variant'] and cell['lr'] == entry['lr']]
            curves = [curve for curve in curves if curve['iter']]
            if not curves:
                continue
            common = sorted(set.intersection(*(set(curve['iter']) for curve in curves)))
            columns = [[dict(zip(curve['iter'], curve['value']))[i] for curve in curves] for i in common]
            ax.plot(common, [statistics.fmean(column) for column in columns], '.-', markersize=3,
                    color=colours[entry['variant']], label=f'{entry["variant"]} (lr {entry["lr"]:g}, '
                    f'{len(curves)} seeds)')
            ax.fill_between(common, [min(column) for column in columns], [max(column) for column in columns],
                            color=colours[entry['variant']], alpha=0.2, linewidth=0)
        ax.set_xlabel('iteration')
        ax.grid(True, which='both', alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)

    fig, ax = plt.subplots(figsize=(7.5, 4.8), constrained_layout=True)
    draw(ax, lambda results: results['loss'])
    ax.set_ylabel('training loss (mean over seeds, band min-max)')
    ax.set_title(f'{suite["name"]}: training loss at each variant\'s best learning rate', fontsize=10)
    fig.savefig(paths['loss.png'], dpi=120)
    plt.close(fig)

    fig, axes = plt.subplots(1, len(KAPPA_CURVES), figsize=(6 * len(KAPPA_CURVES), 4.8), constrained_layout=True)
    for ax, (key, title) in zip(axes, KAPPA_CURVES.items()):
        draw(ax, lambda results: results['kappa'][key])
        ax.set_yscale('log')
        ax.set_ylabel(f'kappa ({key})')
        ax.set_title(title, fontsize=10)
    fig.suptitle(f'{suite["name"]}: condition numbers during training at each variant\'s best learning rate',
                 fontsize=10)
    fig.savefig(paths['kappa.png'], dpi=110)
    plt.close(fig)


def cells_of_phase(suite, phase, phases, cells, args):
    """The cells of one phase, seed-major (a study cut short keeps whole seeds), each with its checkpoint."""
    new = []
    for seed in suite['seeds']:
        for variant in suite['variants']:
            if phases[variant] != phase:
                continue
            lrs = suite['variants'][variant]['lrs']
            if isinstance(lrs, dict):
                lr = best_lr(cells, lrs['best_of'], suite['metric'])
                if lr is None:
                    raise SuiteError(f'variant {variant!r} takes the best rate of {lrs["best_of"]!r}, '
                                     'which has no finished cell')
                lrs = [lr]
            new += [make_cell(suite, variant, lr, seed, args) for lr in lrs]
    schedules = {}  # the schedule does not depend on the seed and rate: one config read per variant
    for cell in new:
        key = (cell['config'], tuple(cell['options'][2:]))
        if key not in schedules:
            schedules[key] = osp.basename(final_checkpoint(cell))
        cell['checkpoint'] = osp.join(cell['work_dir'], schedules[key])
    return new


def main(argv=None):
    args = parse_args(argv)
    try:
        suite = load_suite(args.suite)
    except SuiteError as error:
        sys.exit(f'error: {error}')
    phases = phase_of(suite)
    command = 'python ' + shlex.join([osp.relpath(osp.abspath(__file__), REPO_ROOT), *(argv or sys.argv[1:])])
    cells, start, ran, reused = [], time.perf_counter(), 0, 0
    for phase in range(max(phases.values()) + 1):
        try:
            new = cells_of_phase(suite, phase, phases, cells, args)
        except SuiteError as error:
            if args.dry_run:
                print(f'# phase {phase}: {error} (a dry run trains nothing)')
                break
            sys.exit(f'error: {error}')
        if args.dry_run:
            for cell in new:
                train, test, env = commands(cell, args, 0)
                prefix = ' '.join(f'{key}={value}' for key, value in env.items())
                print(f'# {cell["variant"]} lr {cell["lr"]:g} seed {cell["seed"]}\n{prefix} {shlex.join(train)}\n'
                      f'{prefix} {shlex.join(test)}')
            cells += new
            continue
        states = {id(cell): cell_state(cell) for cell in new}
        if not args.resume and not args.gather_only:
            started = [cell for cell in new if states[id(cell)] != 'new' or osp.isdir(cell['work_dir'])]
            if started:
                sys.exit(f'error: {len(started)} cell(s) of {suite["name"]} already exist under {args.out_dir} '
                         f'(e.g. {started[0]["work_dir"]}); use --resume to continue them (finished cells are '
                         'kept) or another --out-dir')
        pending = [cell for cell in new if states[id(cell)] != 'finished']
        for cell in new:
            if states[id(cell)] == 'finished':
                cell['status'] = 'reused'
            elif args.gather_only:
                cell['status'] = 'missing'
        reused += len(new) - len(pending)
        if not args.gather_only and pending:
            with tqdm(total=len(pending), desc=f'{suite["name"]} phase {phase}', unit='cell') as progress, \
                    ThreadPoolExecutor(max_workers=args.jobs) as pool:
                free_slots = list(range(args.jobs))
                futures = {}
                queue = list(pending)

                def submit():
                    while queue and free_slots:
                        cell = queue.pop(0)
                        slot = free_slots.pop(0)
                        futures[pool.submit(run_cell, cell, args, slot)] = slot

                submit()
                while futures:
                    future = next(as_completed(futures))
                    free_slots.append(futures.pop(future))
                    cell = future.result()
                    ran += 1
                    if cell['status'] == 'failed':
                        progress.write(f'cell {cell["variant"]} lr {cell["lr"]:g} seed {cell["seed"]} failed (exit '
                                       f'code {cell["returncode"]}); log: {cell["log"]}\n--- last lines ---\n'
                                       f'{log_tail(cell["log"])}')
                    progress.update()
                    progress.set_postfix(failed=sum(c.get('status') == 'failed' for c in pending))
                    submit()
        for cell in new:
            cell['results'] = cell_results(cell)
        cells += new
    if args.dry_run:
        return
    rows, best = aggregate(suite, cells)
    summary = dict(command=command, suite=suite['path'], launcher=args.launcher, jobs=args.jobs, nproc=args.nproc,
                   cells=len(cells), ran=ran, reused=reused, wall_s=time.perf_counter() - start,
                   machine=describe_machine(), plateau_fraction=PLATEAU_FRACTION, metric=suite['metric'],
                   reference=suite['reference'], rows=rows, best=best,
                   cells_detail=[{key: cell.get(key) for key in ('variant', 'lr', 'seed', 'work_dir', 'status',
                                                                 'returncode', 'wall_s', 'results')}
                                 for cell in cells])
    os.makedirs(args.out_dir, exist_ok=True)
    paths = {name: osp.join(args.out_dir, name) for name in ('suite.md', 'suite.json', 'ap_vs_lr.png', 'loss.png',
                                                                   'kappa.png')}
    with open(paths['suite.json'], 'w') as f:
        json.dump(summary, f, indent=1)
    table = markdown(suite, rows, best, summary)
    with open(paths['suite.md'], 'w') as f:
        f.write(f'# {suite["name"]}\n\n{suite["description"]}\n\n{table}\nPlots: ap_vs_lr.png, loss.png, kappa.png.\n')
    plot(suite, cells, rows, best, paths)
    print('\n' + table)
    print('wrote ' + ', '.join(paths.values()))
    failed = [cell for cell in cells if cell.get('status') in ('failed', 'missing')]
    if failed:
        sys.exit(f'error: {len(failed)} of {len(cells)} cells did not finish: '
                 + '; '.join(f'{c["variant"]} lr {c["lr"]:g} seed {c["seed"]} ({c["status"]}, {c["work_dir"]})'
                             for c in failed))


if __name__ == '__main__':
    main()
