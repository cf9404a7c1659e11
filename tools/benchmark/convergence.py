"""Convergence study: train the CPU-sized demo Mask R-CNN without and with conditioned tokens, several seeds each.

    python tools/benchmark/convergence.py [--variants baseline condtok condtok-floor] [--seeds 0 1 2]
        [--epochs 12] [--jobs 2] [--data-root data/shapes/] [--out-dir work_dirs/benchmark/convergence]
        [--skip-existing] [--cfg-options KEY=VALUE ...]

Variants are the demo configs: baseline (configs/demo/mask-rcnn_swin-mini_fpn_12e_shapes.py), condtok (its
conditioned twin, mode='sigma_max', the paper's) and condtok-floor (the same with mode='floor'). Every
(variant, seed) is one ``tools/train.py`` run in OUT_DIR/VARIANT/seedS (its output in run.log there) with the
seed, --epochs epochs, the demo's lr decays [9, 11] of 12 scaled to the epochs, kappa recorded every
KAPPA_INTERVAL iterations, one evaluation and one checkpoint at the end, the data under --data-root, and then
the --cfg-options given here (they win). --jobs runs go at a time, the CPUs shared out between them
(OMP_NUM_THREADS). A failed run does not stop the others; its log is named and the script exits with 1.
--skip-existing reuses a run whose work dir already holds its final evaluation (its newest run there).

Writes convergence.md (a table of bbox/segm AP and final training loss, mean +- sample std over seeds),
convergence.json (every run's values and curves, and the aggregates), loss.png and kappa.png (curves over
iterations, mean over seeds with a min-max band) to --out-dir, and prints the table. Create the data with
`python tools/dataset/make_shapes.py --out-dir DATA_ROOT`.
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

from mmengine.config import Config, DictAction
from tqdm import tqdm

from condtok_mm.utils import describe_machine, usable_cpus

REPO_ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
TRAIN_SCRIPT = osp.join(REPO_ROOT, 'tools', 'train.py')
VARIANTS = {  # name: (config, what it is)
    'baseline': ('configs/demo/mask-rcnn_swin-mini_fpn_12e_shapes.py', 'no conditioning'),
    'condtok': ('configs/demo/mask-rcnn_swin-mini-condtok_fpn_12e_shapes.py', "mode='sigma_max' (the paper's)"),
    'condtok-floor': ('configs/demo/mask-rcnn_swin-mini-condtok-floor_fpn_12e_shapes.py', "mode='floor'"),
}
# The demo's schedule: lr decays by 10x after epochs 9 and 11 of 12 (param_scheduler[1], a MultiStepLR).
DEMO_EPOCHS = 12
DEMO_MILESTONES = (9, 11)
# The configs record kappa every 50 iterations, which leaves a 1-epoch run (50 iterations on data/shapes) with
# two points; every 10 draws a curve. One recording took about 65 ms (1 thread) against about 0.85 s for a
# training iteration of these runs, i.e. under 1 % of the training time at 10.
KAPPA_INTERVAL = 10
METRICS = {  # our name: the key of mmdet's CocoMetric in the val record (a fraction; we report percent)
    'bbox_AP': 'coco/bbox_mAP', 'bbox_AP50': 'coco/bbox_mAP_50',
    'segm_AP': 'coco/segm_mAP', 'segm_AP50': 'coco/segm_mAP_50',
}
KAPPA_CURVES = {  # curve: (quantity in the kappa/<quantity>/<where> keys, where: a stage, or None = layer mean)
    'tokens_in_stage0': ('tokens_in_mean', 'stage0'),
    'tokens_out_stage0': ('tokens_out_mean', 'stage0'),
    'attn_softmax_layer_mean': ('attn_softmax_mean', None),
    'attn_out_layer_mean': ('attn_out_mean', None),
}
KAPPA_PANELS = [
    ('tokens_out_stage0', 'embedded tokens entering the first block'),
    ('attn_softmax_layer_mean', 'attention matrix softmax(QK^T), mean over layers'),
    ('attn_out_layer_mean', 'attention output A(X), mean over layers'),
]
LOG_TAIL_LINES = 25


def parse_args():
    parser = argparse.ArgumentParser(
        description='Train the demo configs with several seeds and compare AP, loss and kappa curves')
    parser.add_argument('--variants', nargs='+', choices=list(VARIANTS), default=list(VARIANTS),
                        help='which demo configs to train (default: all)')
    parser.add_argument('--seeds', nargs='+', type=int, default=[0, 1, 2], help='random seeds, one run each')
    parser.add_argument('--epochs', type=int, default=DEMO_EPOCHS, help='training epochs of every run')
    parser.add_argument('--jobs', type=int, default=2, help='runs at a time')
    parser.add_argument('--data-root', default='data/shapes/', help='the shapes dataset (make_shapes.py)')
    parser.add_argument('--out-dir', default='work_dirs/benchmark/convergence',
                        help='work dirs of the runs and the results')
    parser.add_argument('--skip-existing', action='store_true',
                        help='reuse runs whose work dir already holds their final evaluation')
    parser.add_argument('--cfg-options', nargs='+', default=[], metavar='KEY=VALUE',
                        help="more config overrides for every run, as tools/train.py's (applied last)")
    args = parser.parse_args()
    args.variants = list(dict.fromkeys(args.variants))
    args.seeds = list(dict.fromkeys(args.seeds))
    if args.epochs < 1 or args.jobs < 1:
        parser.error('--epochs and --jobs must be positive')
    missing = [split for split in ('train', 'val')
               if not osp.isfile(osp.join(args.data_root, 'annotations', f'instances_{split}.json'))]
    if missing:
        parser.error(f'no shapes dataset at {args.data_root} (annotations/instances_{missing[0]}.json is '
                     f'missing); create it with `python tools/dataset/make_shapes.py --out-dir {args.data_root}` '
                     '(make bench does it)')
    args.data_root = osp.join(osp.abspath(args.data_root), '')
    args.out_dir = osp.abspath(args.out_dir)
    return args


def scaled_milestones(epochs):
    """The demo's decay epochs scaled to ``epochs`` (rounded half up), kept distinct and inside the run
    (1 <= m < epochs: a decay at the last epoch or later never takes effect); a run too short for both gets
    only the later one, or none."""
    milestones, upper = [], epochs
    for milestone in reversed(DEMO_MILESTONES):
        scaled = min(math.floor(epochs * milestone / DEMO_EPOCHS + 0.5), upper - 1)
        if scaled < 1:
            break
        milestones.insert(0, scaled)
        upper = scaled
    return milestones


def run_options(seed, args):
    """--cfg-options of one run: seed, schedule, recording, checkpointing, data, then the user's."""
    val_ann = osp.join(args.data_root, 'annotations', 'instances_val.json')
    return [
        f'randomness.seed={seed}', f'train_cfg.max_epochs={args.epochs}', f'train_cfg.val_interval={args.epochs}',
        f'param_scheduler.1.milestones=[{",".join(str(m) for m in scaled_milestones(args.epochs))}]',
        f'param_scheduler.1.end={args.epochs}', f'custom_hooks.0.interval={KAPPA_INTERVAL}',
        f'default_hooks.checkpoint.interval={args.epochs}', 'default_hooks.checkpoint.max_keep_ckpts=1',
        *(f'{split}_dataloader.dataset.data_root={args.data_root}' for split in ('train', 'val', 'test')),
        f'val_evaluator.ann_file={val_ann}', f'test_evaluator.ann_file={val_ann}',
        *args.cfg_options,
    ]


def resolved_config(variant, args):
    """The variant's config with the options of a run merged in as tools/train.py merges them; stops if the
    indices used by the options no longer point at the demo's MultiStepLR and AttentionConditioningHook."""
    parser = argparse.ArgumentParser()
    parser.add_argument('--cfg-options', nargs='+', action=DictAction)
    options = parser.parse_args(['--cfg-options', *run_options(args.seeds[0], args)]).cfg_options
    path = osp.join(REPO_ROOT, VARIANTS[variant][0])
    cfg = Config.fromfile(path, import_custom_modules=False)
    if cfg.param_scheduler[1].type != 'MultiStepLR' or cfg.custom_hooks[0].type != 'AttentionConditioningHook':
        sys.exit(f'error: {path} no longer has MultiStepLR at param_scheduler[1] and AttentionConditioningHook '
                 f'at custom_hooks[0]; update run_options() in {osp.relpath(__file__, REPO_ROOT)}')
    cfg.merge_from_dict(options)
    return cfg


def newest_scalars(work_dir):
    """vis_data/scalars.json of the newest run in a work dir (mmengine names run folders by timestamp)."""
    files = sorted(glob.glob(osp.join(work_dir, '*', 'vis_data', 'scalars.json')))
    return files[-1] if files else None


def read_scalars(path):
    """The training loss, kappa and final evaluation that mmengine's LocalVisBackend wrote (one JSON a line:
    training records have 'loss' and 'iter', the hook's 'kappa/...' keys, evaluation records 'coco/...' and
    the epoch as 'step')."""
    loss_iters, loss_values, kappa, evaluation = [], [], {}, None
    with open(path) as f:
        for line in f:
            record = json.loads(line)
            if METRICS['bbox_AP'] in record:
                evaluation = record
            elif 'loss' in record:
                loss_iters.append(record['iter'])
                loss_values.append(record['loss'])
            else:
                for key, value in record.items():
                    if key.startswith('kappa/'):
                        kappa.setdefault(record['step'], {})[key] = value
    return loss_iters, loss_values, kappa, evaluation


def kappa_curves(kappa_by_step):
    """{curve: {'iter': [...], 'value': [...]}} for KAPPA_CURVES; a layer mean averages over the layers."""
    curves = {name: dict(iter=[], value=[]) for name in KAPPA_CURVES}
    for step in sorted(kappa_by_step):
        record = kappa_by_step[step]
        for name, (quantity, where) in KAPPA_CURVES.items():
            if where is None:
                values = [v for k, v in record.items() if k.startswith(f'kappa/{quantity}/layer')]
                value = sum(values) / len(values) if values else None
            else:
                value = record.get(f'kappa/{quantity}/{where}')
            if value is not None:
                curves[name]['iter'].append(step)
                curves[name]['value'].append(value)
    return curves


def run_results(work_dir, epochs):
    """The values of the newest run in a work dir, or None unless it evaluated after epoch ``epochs``."""
    path = newest_scalars(work_dir)
    if path is None:
        return None
    loss_iters, loss_values, kappa, evaluation = read_scalars(path)
    if evaluation is None or evaluation['step'] != epochs or not loss_values:
        return None
    return dict(scalars=path, iterations=loss_iters[-1], final_loss=loss_values[-1],
                **{name: 100 * evaluation[key] for name, key in METRICS.items()},
                curves=dict(loss=dict(iter=loss_iters, value=loss_values), **kappa_curves(kappa)))


def train(run, options, threads):
    """Run tools/train.py for one (variant, seed); returns (exit code, seconds)."""
    os.makedirs(run['work_dir'], exist_ok=True)
    command = [sys.executable, TRAIN_SCRIPT, osp.join(REPO_ROOT, run['config']), '--work-dir', run['work_dir'],
               '--cfg-options', *options]
    # Each run's PyTorch uses its share of the CPUs: with its default (all cores) --jobs runs oversubscribe.
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    start = time.perf_counter()
    with open(run['log'], 'w') as log:
        log.write(shlex.join(command) + '\n\n')
        log.flush()
        returncode = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env=env).returncode
    return returncode, time.perf_counter() - start


def log_tail(path):
    with open(path, errors='replace') as f:
        return ''.join(f.readlines()[-LOG_TAIL_LINES:])


def mean_std(values):
    """Mean and sample standard deviation (0 for one value)."""
    return dict(mean=statistics.fmean(values), std=statistics.stdev(values) if len(values) > 1 else 0.0,
                n=len(values))


def mean_curve(curves):
    """Mean, min and max over runs at the iterations all of them recorded."""
    common = sorted(set.intersection(*(set(curve['iter']) for curve in curves)))
    at = [dict(zip(curve['iter'], curve['value'])) for curve in curves]
    columns = [[values[i] for values in at] for i in common]
    return dict(iter=common, mean=[statistics.fmean(c) for c in columns], min=[min(c) for c in columns],
                max=[max(c) for c in columns])


def aggregate(variant, runs):
    done = [run for run in runs if run['status'] != 'failed']
    summary = dict(config=VARIANTS[variant][0], what=VARIANTS[variant][1], seeds=[run['seed'] for run in done],
                   failed_seeds=[run['seed'] for run in runs if run['status'] == 'failed'])
    if done:
        for name in (*METRICS, 'final_loss'):
            summary[name] = mean_std([run[name] for run in done])
        summary['curves'] = {name: mean_curve([run['curves'][name] for run in done])
                             for name in done[0]['curves']}
    return summary


def plural(count, noun):
    """'1 epoch', '12 epochs'; '? epochs' for None (the iterations when every run failed)."""
    return f'{"?" if count is None else count} {noun}{"" if count == 1 else "s"}'


def plot_curves(ax, variants, curve, colours):
    for variant, summary in variants.items():
        if 'curves' not in summary or not summary['curves'][curve]['iter']:
            continue
        values = summary['curves'][curve]
        seeds = len(summary['seeds'])
        ax.plot(values['iter'], values['mean'], '.-', color=colours[variant], markersize=3, linewidth=1.5,
                label=f'{variant} (mean of {seeds} seed{"s" if seeds > 1 else ""})')
        if seeds > 1:
            ax.fill_between(values['iter'], values['min'], values['max'], color=colours[variant], alpha=0.2,
                            linewidth=0)
    ax.set_xlabel('iteration')
    ax.grid(True, which='both', alpha=0.3)
    if ax.get_legend_handles_labels()[0]:  # none when every run of the variants failed
        ax.legend(fontsize=8)


def plot(variants, summary, loss_path, kappa_path):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    colours = {variant: f'C{i}' for i, variant in enumerate(VARIANTS)}
    subtitle = (f'{plural(summary["epochs"], "epoch")}, {plural(summary["iterations"], "iteration")}; mean over '
                'seeds, band: min-max over seeds')

    fig, ax = plt.subplots(figsize=(7.5, 4.8), constrained_layout=True)
    plot_curves(ax, variants, 'loss', colours)
    ax.set_ylabel(f'training loss (running mean over up to {summary["loss_window"]} iterations)')
    ax.set_title(f'Training loss of the demo Mask R-CNN\n{subtitle}', fontsize=10)
    fig.savefig(loss_path, dpi=120)
    plt.close(fig)

    fig, axes = plt.subplots(1, len(KAPPA_PANELS), figsize=(6 * len(KAPPA_PANELS), 4.8), constrained_layout=True)
    for ax, (curve, title) in zip(axes, KAPPA_PANELS):
        plot_curves(ax, variants, curve, colours)
        if curve == 'tokens_out_stage0' and summary['target_kappa'] is not None:
            ax.axhline(summary['target_kappa'], color='grey', linestyle=':', linewidth=1,
                       label=f'target kappa {summary["target_kappa"]:g}')
            ax.legend(fontsize=8)
        ax.set_yscale('log')
        ax.set_ylabel('kappa')
        ax.set_title(title, fontsize=10)
    fig.suptitle(f'Condition numbers during training (AttentionConditioningHook every {KAPPA_INTERVAL} '
                 f'iterations); {subtitle}', fontsize=10)
    fig.savefig(kappa_path, dpi=110)
    plt.close(fig)


def markdown_table(variants, summary):
    def cell(value, digits=1):
        return f'{value["mean"]:.{digits}f} ± {value["std"]:.{digits}f}'

    lines = ['| variant | config | seeds | bbox AP | bbox AP50 | segm AP | segm AP50 | final training loss |',
             '|---|---|---|---|---|---|---|---|']
    for variant, values in variants.items():
        seeds = ', '.join(str(seed) for seed in values['seeds']) or 'none'
        if values['failed_seeds']:
            seeds += f' (failed: {", ".join(str(seed) for seed in values["failed_seeds"])})'
        numbers = ([cell(values[name]) for name in METRICS] + [cell(values['final_loss'], 3)]
                   if values['seeds'] else ['n/a'] * (len(METRICS) + 1))
        lines.append(f'| {variant}: {values["what"]} | `{values["config"]}` | {seeds} | ' + ' | '.join(numbers)
                     + ' |')
    machine = summary['machine']
    wall = [run['wall_s'] for run in summary['runs'] if run['status'] == 'trained']
    reused = sum(run['status'] == 'reused' for run in summary['runs'])
    timing = (f'; {statistics.fmean(wall) / 60:.1f} min per run trained now, {summary["wall_s"] / 60:.1f} min '
              f'in all' if wall else '') + (f'; {plural(reused, "run")} reused from earlier' if reused else '')
    decay = (f'lr x{summary["lr_gamma"]:g} after epoch{"s" if len(summary["milestones"]) > 1 else ""} '
             + ' and '.join(str(m) for m in summary['milestones']) if summary['milestones']
             else 'no lr decay: too short for one')
    lines += ['',
              f'AP in percent on the {summary["val_images"]} val images of `{summary["data_root"]}`, mean ± sample '
              f'std over seeds; final training loss: the loss logged at the last iteration, a running mean over '
              f'up to {summary["loss_window"]} iterations. {plural(summary["epochs"], "epoch")} = '
              f'{plural(summary["iterations"], "iteration")} per run ({decay}). Machine: {machine["cpu"]}, '
              f'{machine["usable_cpus"]} usable CPUs, torch {machine["torch"]}; {plural(summary["jobs"], "run")} at '
              f'a time with {plural(summary["threads_per_run"], "thread")} each{timing}. Command: '
              f'`{summary["command"]}`']
    return '\n'.join(lines) + '\n'


def main():
    args = parse_args()
    configs = {variant: resolved_config(variant, args) for variant in args.variants}
    threads = max(1, usable_cpus() // args.jobs)
    runs = [dict(variant=variant, seed=seed, config=VARIANTS[variant][0],
                 work_dir=osp.join(args.out_dir, variant, f'seed{seed}'),
                 log=osp.join(args.out_dir, variant, f'seed{seed}', 'run.log'))
            for variant in args.variants for seed in args.seeds]
    start = time.perf_counter()
    with tqdm(total=len(runs), desc='training runs', unit='run') as progress:
        pending = []
        for run in runs:
            results = run_results(run['work_dir'], args.epochs) if args.skip_existing else None
            if results is None:
                pending.append(run)
            else:
                run.update(status='reused', returncode=None, wall_s=None, **results)
                progress.update()
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            futures = {pool.submit(train, run, run_options(run['seed'], args), threads): run for run in pending}
            for future in as_completed(futures):
                run = futures[future]
                returncode, seconds = future.result()
                results = run_results(run['work_dir'], args.epochs) if returncode == 0 else None
                run.update(status='trained' if results else 'failed', returncode=returncode, wall_s=seconds,
                           **(results or {}))
                if results is None:
                    why = (f'exit code {returncode}' if returncode else
                           f'no evaluation after epoch {args.epochs} in its scalars.json')
                    progress.write(f'run {run["variant"]} seed {run["seed"]} failed ({why}); log: {run["log"]}\n'
                                   f'--- last lines of the log ---\n{log_tail(run["log"])}')
                progress.update()
                progress.set_postfix(failed=sum(r.get('status') == 'failed' for r in runs))
    wall_s = time.perf_counter() - start

    variants = {variant: aggregate(variant, [run for run in runs if run['variant'] == variant])
                for variant in args.variants}
    finished = [run for run in runs if run['status'] != 'failed']
    target_kappas = [cfg.model.backbone.conditioning.target_kappa for cfg in configs.values()
                     if 'conditioning' in cfg.model.backbone]
    with open(configs[args.variants[0]].val_evaluator.ann_file) as f:
        val_images = len(json.load(f)['images'])
    summary = dict(command='python ' + shlex.join(sys.argv), epochs=args.epochs,
                   iterations=finished[0]['iterations'] if finished else None,
                   milestones=scaled_milestones(args.epochs),
                   lr_gamma=configs[args.variants[0]].param_scheduler[1].gamma, kappa_interval=KAPPA_INTERVAL,
                   loss_window=configs[args.variants[0]].log_processor.window_size,
                   target_kappa=target_kappas[0] if target_kappas else None, data_root=args.data_root,
                   val_images=val_images, jobs=args.jobs, threads_per_run=threads, wall_s=wall_s,
                   machine=describe_machine(), variants=variants, runs=runs)

    os.makedirs(args.out_dir, exist_ok=True)
    paths = {name: osp.join(args.out_dir, name)
             for name in ('convergence.md', 'convergence.json', 'loss.png', 'kappa.png')}
    with open(paths['convergence.json'], 'w') as f:
        json.dump(summary, f, indent=1)
    table = markdown_table(variants, summary)
    with open(paths['convergence.md'], 'w') as f:
        f.write(f'# Convergence of the demo Mask R-CNN\n\n{table}\nCurves: loss.png, kappa.png.\n')
    plot(variants, summary, paths['loss.png'], paths['kappa.png'])
    print('\n' + table)
    print('wrote ' + ', '.join(paths.values()))
    failed = [run for run in runs if run['status'] == 'failed']
    if failed:
        sys.exit(f'error: {len(failed)} of {len(runs)} runs failed: '
                 + '; '.join(f'{run["variant"]} seed {run["seed"]} (log: {run["log"]})' for run in failed))


if __name__ == '__main__':
    main()
