"""Train named variants from the same seed and initial weights, and compare their training dynamics per block.

    python tools/analysis/compare_training_dynamics.py \\
        --variant baseline configs/demo/mask-rcnn_swin-mini_fpn_12e_shapes.py \\
        --variant condtok configs/demo/mask-rcnn_swin-mini-condtok_fpn_12e_shapes.py \\
        [--variant NAME CONFIG [KEY=VALUE ...]] [--reference NAME] [--iters 250] [--interval 10] [--seed 0]
        [--lr LR] [--factor 1.5] [--out-dir work_dirs/training_dynamics] [--cfg-options KEY=VALUE ...]

Each variant is a name, a config and optional KEY=VALUE overrides of that config (as --cfg-options). The
variants are trained one after the other in this process (mmengine's Runner.from_cfg), each for --iters
iterations with TrainingDynamicsHook recording every --interval iterations (condtok_mm/engine/hooks/
training_dynamics.py: per backbone block the residual-stream RMS, the attention and MLP updates relative to
the stream, the attention entropy and the gradient norm; the loss and the total gradient norm), and nothing
else changed between them: the same seed (so the same initial weights, which the tool checks and reports, and
the same data order), the config's own optimizer and schedule (epoch-based schedulers converted to the
iterations they cover; --lr replaces the base learning rate), no validation, no checkpoints. Overrides apply
in this order: the config, --cfg-options, the variant's own KEY=VALUE, then the tool's settings.

Writes to --out-dir: training_dynamics.json (the curves, the initial-weight check, the table), one PNG per
quantity (a panel per block, a curve per variant), global.png (loss and total gradient norm), one
ratio_VARIANT_vs_REFERENCE.png per variant (log2 of variant/reference, block x iteration heatmaps) and
training_dynamics.md, the table it prints: per quantity and block, the first recorded iteration at which each
variant differs from the reference by more than --factor (either way), the iteration from which it stays so,
and the ratio at the last recorded iteration. Each variant's run is in OUT_DIR/NAME (its log and
vis_data/scalars.json).
"""
import argparse
import json
import math
import os
import os.path as osp
import re
import sys

import matplotlib
import numpy as np
import torch
from mmengine.config import Config, DictAction
from mmengine.hooks import Hook
from mmengine.runner import Runner
from tqdm import tqdm

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))
import condtok_mm  # noqa: E402,F401  (registration)
from condtok_mm import compat  # noqa: E402
from condtok_mm.engine.hooks.training_dynamics import BLOCK_QUANTITIES  # noqa: E402
from condtok_mm.utils import (DatasetNotFoundError, check_dataset_files, describe_machine,  # noqa: E402
                              fall_back_from_amp_on_cpu)

QUANTITY_TITLES = {
    'stream_rms': 'RMS of the residual stream entering the block',
    'attn_update_ratio': '||attention update|| / ||stream||',
    'mlp_update_ratio': '||MLP update|| / ||stream||',
    'attn_entropy': 'attention entropy (nats, mean over heads and queries)',
    'grad_norm': 'gradient norm of the block parameters',
}
GLOBAL_TITLES = {
    'loss_smoothed': 'total loss (mean over the last --interval iterations)',
    'loss': 'total loss (the recorded iteration)',
    'grad_norm_total': 'gradient norm of all parameters',
}
LINEAR_SCALE = {'attn_entropy', 'loss', 'loss_smoothed'}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description='Train variants from the same initial weights and compare their per-block training dynamics')
    parser.add_argument('--variant', action='append', nargs='+', required=True, metavar='NAME CONFIG [KEY=VALUE',
                        help='a variant: its name, its config and optional KEY=VALUE overrides; give two or more')
    parser.add_argument('--reference', help='the variant the others are compared with (default: the first)')
    parser.add_argument('--iters', type=int, default=250, help='training iterations of every variant')
    parser.add_argument('--interval', type=int, default=10, help='record every this many iterations')
    parser.add_argument('--seed', type=int, default=0, help='random seed of every variant')
    parser.add_argument('--lr', type=float, help="base learning rate of every variant (default: the config's)")
    parser.add_argument('--factor', type=float, default=1.5,
                        help='a variant "differs" where variant/reference is above this or below its inverse')
    parser.add_argument('--out-dir', default='work_dirs/training_dynamics', help='runs and results')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction, default={},
                        help='overrides for every variant, as tools/train.py takes them')
    args = parser.parse_args(argv)
    variants = {}
    for spec in args.variant:
        if len(spec) < 2:
            parser.error(f'--variant {" ".join(spec)}: give a name and a config, then optional KEY=VALUE')
        name, config, options = spec[0], spec[1], spec[2:]
        if name in variants:
            parser.error(f'--variant {name} is given twice; give each variant its own name')
        if not re.fullmatch(r'[A-Za-z0-9_.+-]+', name):
            parser.error(f'--variant {name}: use letters, digits and _.+- in names (they name folders and files)')
        if not osp.isfile(config):
            parser.error(f'--variant {name}: config {config} not found')
        bad = [option for option in options if '=' not in option]
        if bad:
            parser.error(f'--variant {name}: {bad[0]!r} is not KEY=VALUE')
        variants[name] = dict(config=config, cfg_options=options)
    if len(variants) < 2:
        parser.error('give at least two --variant to compare')
    args.reference = args.reference or next(iter(variants))
    if args.reference not in variants:
        parser.error(f'--reference {args.reference} is not a variant; the variants are {", ".join(variants)}')
    if args.iters < 1 or args.interval < 1 or args.factor <= 1:
        parser.error('--iters and --interval must be positive, and --factor above 1')
    args.variants = variants
    return args


def parse_options(options):
    """KEY=VALUE strings as the dict Config.merge_from_dict takes (parsed as by DictAction)."""
    parser = argparse.ArgumentParser()
    parser.add_argument('--cfg-options', nargs='+', action=DictAction, default={})
    return parser.parse_args(['--cfg-options', *options] if options else []).cfg_options


def variant_config(name, variant, args):
    """The variant's config with the overrides merged and the tool's settings applied."""
    cfg = Config.fromfile(variant['config'])
    cfg.merge_from_dict(args.cfg_options)
    cfg.merge_from_dict(parse_options(variant['cfg_options']))
    cfg.work_dir = osp.join(args.out_dir, name)
    # Runners built in one process share the MessageHub and Visualizer instance of a name: give each its own.
    cfg.experiment_name = f'training_dynamics_{name}'
    if isinstance(cfg.get('visualizer'), dict):
        cfg.visualizer.name = f'training_dynamics_{name}'
        backends = cfg.visualizer.setdefault('vis_backends', [])
        if not any(backend.get('type') == 'LocalVisBackend' for backend in backends):
            backends.append(dict(type='LocalVisBackend'))  # the curves are read back from its scalars.json
    cfg.merge_from_dict({'randomness.seed': args.seed})
    # Iterations instead of epochs; an epoch-based scheduler is converted to the iterations it covers, so every
    # iteration gets the learning rate the config gives it.
    cfg.train_cfg = dict(type='IterBasedTrainLoop', max_iters=args.iters, val_interval=args.iters + 1)
    schedulers = cfg.get('param_scheduler') or []
    for scheduler in [schedulers] if isinstance(schedulers, dict) else schedulers:
        if scheduler.get('by_epoch', True):
            scheduler['convert_to_iter_based'] = True
    cfg.merge_from_dict({'log_processor.by_epoch': False})
    cfg.val_cfg = cfg.val_dataloader = cfg.val_evaluator = None
    cfg.default_hooks.checkpoint = None
    if args.lr is not None:
        cfg.optim_wrapper.optimizer.lr = args.lr
    hooks = [hook for hook in cfg.get('custom_hooks', []) if hook.get('type') != 'TrainingDynamicsHook']
    cfg.custom_hooks = hooks + [dict(type='TrainingDynamicsHook', interval=args.interval)]
    fall_back_from_amp_on_cpu(cfg)
    return cfg


class _WatchTraining(Hook):
    """The tool's view of a run: the model's state dict when training starts, and the progress bar."""

    priority = 'VERY_HIGH'

    def __init__(self, progress):
        self.progress = progress
        self.initial_state = None

    def before_train(self, runner):
        model = runner.model.module if hasattr(runner.model, 'module') else runner.model
        self.initial_state = {key: value.detach().cpu().clone() for key, value in model.state_dict().items()}

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        self.progress.update(1)


def train_variant(cfg, progress):
    """Train one variant; its scalars.json and its model's initial state dict."""
    runner = Runner.from_cfg(cfg)
    watch = _WatchTraining(progress)
    runner.register_hook(watch)
    runner.train()
    return osp.join(runner.log_dir, 'vis_data', 'scalars.json'), watch.initial_state


def compare_states(reference, other):
    """Whether two initial state dicts are equal, for the backbone and for the whole model."""
    if set(reference) != set(other):
        differing = sorted(set(reference) ^ set(other))
        return dict(backbone_equal=False, model_equal=False, comparable=False, differing_keys=differing[:20])
    differing = [key for key in reference if not torch.equal(reference[key], other[key])]
    return dict(backbone_equal=not any(key.startswith('backbone.') for key in differing),
                model_equal=not differing, comparable=True, differing_keys=differing[:20])


def read_dynamics(path):
    """{name: {'iter': [...], 'value': [...]}} of the TrainingDynamicsHook scalars in a scalars.json; the name
    drops the 'dynamics/' prefix (e.g. 'stream_rms/stages.0.blocks.0', 'loss')."""
    curves = {}
    with open(path) as f:
        for line in f:
            record = json.loads(line)
            for key, value in record.items():
                if key.startswith('dynamics/'):
                    curve = curves.setdefault(key[len('dynamics/'):], dict(iter=[], value=[]))
                    curve['iter'].append(record['step'])
                    curve['value'].append(value)
    if not curves:
        raise RuntimeError(f'{path} holds no dynamics/ scalars: TrainingDynamicsHook did not record')
    return curves


def natural_key(name):
    """'stages.0.blocks.10' after 'stages.0.blocks.2'."""
    return [int(part) if part.isdigit() else part for part in re.split(r'(\d+)', name)]


def blocks_of(curves):
    return sorted({key.split('/', 1)[1] for key in curves if key.startswith('stream_rms/')}, key=natural_key)


def separation(reference, variant, factor):
    """Where ``variant`` differs from ``reference`` (two curves) by more than ``factor``, over the iterations
    both recorded with positive finite values: the first such iteration, the iteration from which every later
    one does too (None if none does), and variant/reference at the last common iteration."""
    ref = dict(zip(reference['iter'], reference['value']))
    var = dict(zip(variant['iter'], variant['value']))
    steps = [s for s in sorted(set(ref) & set(var))
             if all(math.isfinite(v) and v > 0 for v in (ref[s], var[s]))]
    ratios = [var[s] / ref[s] for s in steps]
    apart = [max(r, 1 / r) > factor for r in ratios]
    first = next((s for s, a in zip(steps, apart) if a), None)
    sustained = None
    for step, is_apart in reversed(list(zip(steps, apart))):
        if not is_apart:
            break
        sustained = step
    return dict(first=first, sustained=sustained, end_step=steps[-1] if steps else None,
                end_ratio=ratios[-1] if ratios else None)


def separation_rows(curves, reference, factor):
    """One row per quantity and block (and per global quantity): its separation from the reference for every
    other variant."""
    blocks = blocks_of(curves[reference])
    places = [(q, b) for q in BLOCK_QUANTITIES for b in blocks] + [(q, None) for q in GLOBAL_TITLES]
    rows = []
    for quantity, block in places:
        key = f'{quantity}/{block}' if block else quantity
        if key not in curves[reference]:
            continue
        row = dict(quantity=quantity, block=block or 'model', key=key, variants={})
        for name, variant_curves in curves.items():
            if name != reference and key in variant_curves:
                row['variants'][name] = separation(curves[reference][key], variant_curves[key], factor)
        rows.append(row)
    return rows


def markdown_table(rows, reference, factor):
    others = list(rows[0]['variants']) if rows else []
    header = ['quantity', 'block']
    for name in others:
        header += [f'{name}: first >{factor:g}x', f'{name}: stays from', f'{name}/{reference} at end']
    lines = ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]

    def step(value):
        return '—' if value is None else str(value)

    for row in rows:
        cells = [row['quantity'], row['block']]
        for name in others:
            found = row['variants'].get(name, {})
            ratio = found.get('end_ratio')
            cells += [step(found.get('first')), step(found.get('sustained')),
                      '—' if ratio is None else f'{ratio:.3g}']
        lines.append('| ' + ' | '.join(cells) + ' |')
    return '\n'.join(lines)


def _grid(count):
    columns = min(count, 4)
    return math.ceil(count / columns), columns


def plot_block_quantity(curves, quantity, blocks, path, interval):
    rows, columns = _grid(len(blocks))
    fig, axes = plt.subplots(rows, columns, figsize=(4.2 * columns, 3.2 * rows), squeeze=False,
                             constrained_layout=True)
    for ax, block in zip(axes.flat, blocks):
        for name, variant_curves in curves.items():
            curve = variant_curves.get(f'{quantity}/{block}')
            if curve:
                ax.plot(curve['iter'], curve['value'], label=name)
        ax.set_title(block, fontsize=9)
        ax.set_xlabel('iteration')
        if quantity not in LINEAR_SCALE:
            ax.set_yscale('log')
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(blocks):]:
        ax.axis('off')
    axes.flat[0].legend(fontsize=8)
    fig.suptitle(f'{QUANTITY_TITLES[quantity]} (recorded every {interval} iterations)')
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_global(curves, path):
    quantities = [q for q in GLOBAL_TITLES if any(q in c for c in curves.values())]
    fig, axes = plt.subplots(1, len(quantities), figsize=(5.5 * len(quantities), 4), squeeze=False,
                             constrained_layout=True)
    for ax, quantity in zip(axes.flat, quantities):
        for name, variant_curves in curves.items():
            if quantity in variant_curves:
                ax.plot(variant_curves[quantity]['iter'], variant_curves[quantity]['value'], label=name)
        ax.set_title(GLOBAL_TITLES[quantity], fontsize=9)
        ax.set_xlabel('iteration')
        if quantity not in LINEAR_SCALE:
            ax.set_yscale('log')
        ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=8)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def log2_ratio(reference, variant):
    """log2(variant / reference) at the reference's iterations (nan where either is missing or not positive)."""
    var = dict(zip(variant['iter'], variant['value']))
    values = []
    for step, ref in zip(reference['iter'], reference['value']):
        other = var.get(step, math.nan)
        values.append(math.log2(other / ref) if ref > 0 and other > 0 else math.nan)
    return values


def plot_ratio(curves, reference, name, blocks, factor, path):
    """Heatmaps of log2(variant / reference), block x iteration, one per block quantity, and the global ones."""
    ref_curves, var_curves = curves[reference], curves[name]
    panels = []
    for quantity in BLOCK_QUANTITIES:
        present = [b for b in blocks if f'{quantity}/{b}' in ref_curves and f'{quantity}/{b}' in var_curves]
        if present:
            panels.append((QUANTITY_TITLES[quantity], present, [f'{quantity}/{b}' for b in present]))
    global_keys = [q for q in GLOBAL_TITLES if q in ref_curves and q in var_curves]
    if global_keys:
        panels.append(('loss and total gradient norm', global_keys, global_keys))
    rows, columns = _grid(len(panels))
    fig, axes = plt.subplots(rows, columns, figsize=(5.5 * columns, 0.35 * len(blocks) * rows + 2.5 * rows),
                             squeeze=False, constrained_layout=True)
    limit = 2 * math.log2(factor)
    maps = []
    for ax, (title, labels, keys) in zip(axes.flat, panels):
        steps = ref_curves[keys[0]]['iter']
        matrix = np.array([log2_ratio(ref_curves[key], var_curves[key])[:len(steps)] for key in keys])
        finite = np.abs(matrix[np.isfinite(matrix)])
        limit = max(limit, float(finite.max()) if finite.size else 0.0)
        maps.append(ax.imshow(matrix, aspect='auto', cmap='coolwarm', interpolation='nearest'))
        ax.set_yticks(range(len(labels)), labels, fontsize=7)
        # one column per recording (the first is iteration 1, then every --interval): label some of them
        ticks = sorted(set(np.linspace(0, len(steps) - 1, min(len(steps), 8)).round().astype(int).tolist()))
        ax.set_xticks(ticks, [str(steps[t]) for t in ticks], fontsize=7)
        ax.set_xlabel('iteration (one column per recording)')
        ax.set_title(title, fontsize=9)
    for image in maps:
        image.set_clim(-limit, limit)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis('off')
    fig.colorbar(maps[0], ax=axes, shrink=0.8, label=f'log2({name} / {reference}); ±{math.log2(factor):.2f} is '
                                                      f'{factor:g}x')
    fig.suptitle(f'{name} relative to {reference}')
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    args = parse_args(argv)
    compat.apply()  # our tools run with the fixes for the installed stack, whatever the config imports
    args.out_dir = osp.abspath(args.out_dir)
    os.makedirs(args.out_dir, exist_ok=True)
    configs = {name: variant_config(name, variant, args) for name, variant in args.variants.items()}
    for name, cfg in configs.items():
        try:
            check_dataset_files(cfg, splits=('train',))
        except DatasetNotFoundError as error:
            sys.exit(f'error: variant {name}: {error}')

    scalars, initial = {}, {}
    reference_state = None
    with tqdm(total=args.iters * len(configs), desc='training variants', unit='it') as progress:
        # the reference first, so that every other variant's initial weights are compared with it as it trains
        for name in sorted(configs, key=lambda n: n != args.reference):
            progress.set_postfix_str(name)
            scalars[name], state = train_variant(configs[name], progress)
            if reference_state is None:
                reference_state = state
            else:
                initial[name] = compare_states(reference_state, state)
    curves = {name: read_dynamics(scalars[name]) for name in args.variants}

    blocks = blocks_of(curves[args.reference])
    written = []
    for quantity in BLOCK_QUANTITIES:
        path = osp.join(args.out_dir, f'{quantity}.png')
        plot_block_quantity(curves, quantity, blocks, path, args.interval)
        written.append(path)
    path = osp.join(args.out_dir, 'global.png')
    plot_global(curves, path)
    written.append(path)
    for name in args.variants:
        if name != args.reference:
            path = osp.join(args.out_dir, f'ratio_{name}_vs_{args.reference}.png')
            plot_ratio(curves, args.reference, name, blocks, args.factor, path)
            written.append(path)

    rows = separation_rows(curves, args.reference, args.factor)
    table = markdown_table(rows, args.reference, args.factor)
    weights_lines = []
    for name, check in initial.items():
        if check['model_equal']:
            weights_lines.append(f'- {name}: the same initial weights as {args.reference} (whole model)')
        elif check['backbone_equal']:
            weights_lines.append(f'- {name}: the same initial backbone as {args.reference}; other parameters '
                                 f'differ: {", ".join(check["differing_keys"])}')
        else:
            reason = ('the state dicts have different keys' if not check['comparable']
                      else 'the backbone parameters differ')
            weights_lines.append(f'- {name}: NOT the same initial weights as {args.reference} ({reason}: '
                                 f'{", ".join(check["differing_keys"])}); the comparison mixes initialisation '
                                 'with the variant')
    lr = f'lr {args.lr:g}' if args.lr is not None else "the configs' lr"
    summary = (f'Training dynamics, {args.iters} iterations, seed {args.seed}, {lr}, recorded every '
               f'{args.interval} iterations; reference {args.reference}; "first" is the first recorded '
               f'iteration where variant/{args.reference} is above {args.factor:g} or below 1/{args.factor:g}, '
               '"stays from" the one from which every later recording is. Norms and entropies run over all '
               'tokens of the batch, padding included.')
    markdown = '\n'.join([summary, '', 'Initial weights:', *weights_lines, '', table, ''])
    with open(osp.join(args.out_dir, 'training_dynamics.md'), 'w') as f:
        f.write(markdown)
    result = dict(
        args=dict(iters=args.iters, interval=args.interval, seed=args.seed, lr=args.lr, factor=args.factor,
                  reference=args.reference, cfg_options=args.cfg_options),
        variants={name: dict(config=variant['config'], cfg_options=variant['cfg_options'],
                             scalars=scalars[name]) for name, variant in args.variants.items()},
        machine=describe_machine(), initial_weights=initial, blocks=blocks, curves=curves, separation=rows)
    with open(osp.join(args.out_dir, 'training_dynamics.json'), 'w') as f:
        json.dump(result, f, indent=1)
    print(markdown)
    print('wrote ' + ', '.join([osp.join(args.out_dir, 'training_dynamics.json'),
                                osp.join(args.out_dir, 'training_dynamics.md'), *written]))


if __name__ == '__main__':
    main()
