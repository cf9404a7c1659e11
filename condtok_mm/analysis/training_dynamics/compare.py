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
in this order: the config, --cfg-options, the variant's own KEY=VALUE, then the tool's settings. Why this is not
a suite: :mod:`condtok_mm.analysis.training_dynamics`.

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
import os
import os.path as osp
import re
import sys

from tqdm import tqdm

import condtok_mm  # noqa: F401  (registration)
from condtok_mm import compat
from condtok_mm.engine.hooks.training_dynamics import BLOCK_QUANTITIES
from condtok_mm.utils import DatasetNotFoundError, check_dataset_files, describe_machine
from .figures import plot_block_quantity, plot_global, plot_ratio
from .separation import blocks_of, markdown_table, read_dynamics, separation_rows
from .variants import compare_states, initial_weights_lines, train_variant, variant_config


def parse_args(argv=None):
    """The command line (``argv``, default ``sys.argv[1:]``), its variants checked: ``args.variants`` is {name:
    dict(config, cfg_options)} in the order given, ``args.reference`` a variant's name."""
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
    parser.add_argument('--cfg-options', nargs='+', default=[], metavar='KEY=VALUE',
                        help='overrides for every variant, as tools/train.py takes them')
    args = parser.parse_args(argv)
    bad = [option for option in args.cfg_options if '=' not in option]
    if bad:
        parser.error(f'--cfg-options: {bad[0]!r} is not KEY=VALUE')
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


def write_figures(curves, args):
    """Every figure of the comparison in ``args.out_dir``; their paths."""
    blocks = blocks_of(curves[args.reference])
    written = []
    for quantity in BLOCK_QUANTITIES:
        written.append(osp.join(args.out_dir, f'{quantity}.png'))
        plot_block_quantity(curves, quantity, blocks, written[-1], args.interval)
    written.append(osp.join(args.out_dir, 'global.png'))
    plot_global(curves, written[-1])
    for name in args.variants:
        if name != args.reference:
            written.append(osp.join(args.out_dir, f'ratio_{name}_vs_{args.reference}.png'))
            plot_ratio(curves, args.reference, name, blocks, args.factor, written[-1])
    return written


def main(argv=None):
    """Train the variants of the command line ``argv`` (default ``sys.argv[1:]``), compare them, write and print
    the results (the module docstring)."""
    args = parse_args(argv)
    compat.apply()  # our tools run with the fixes for the installed stack, whatever the config imports
    args.out_dir = osp.abspath(args.out_dir)
    os.makedirs(args.out_dir, exist_ok=True)
    configs = {name: variant_config(name, variant['config'], [*args.cfg_options, *variant['cfg_options']],
                                    args.out_dir, args.iters, args.interval, args.seed, args.lr)
               for name, variant in args.variants.items()}
    for name, cfg in configs.items():
        try:
            check_dataset_files(cfg, splits=('train', ))
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
    written = write_figures(curves, args)

    rows = separation_rows(curves, args.reference, args.factor)
    lr = f'lr {args.lr:g}' if args.lr is not None else "the configs' lr"
    summary = (f'Training dynamics, {args.iters} iterations, seed {args.seed}, {lr}, recorded every '
               f'{args.interval} iterations; reference {args.reference}; "first" is the first recorded '
               f'iteration where variant/{args.reference} is above {args.factor:g} or below 1/{args.factor:g}, '
               '"stays from" the one from which every later recording is. Norms and entropies run over all '
               'tokens of the batch, padding included.')
    markdown = '\n'.join([summary, '', 'Initial weights:', *initial_weights_lines(initial, args.reference), '',
                          markdown_table(rows, args.reference, args.factor), ''])
    with open(osp.join(args.out_dir, 'training_dynamics.md'), 'w') as f:
        f.write(markdown)
    result = dict(
        args=dict(iters=args.iters, interval=args.interval, seed=args.seed, lr=args.lr, factor=args.factor,
                  reference=args.reference, cfg_options=args.cfg_options),
        variants={name: dict(config=variant['config'], cfg_options=variant['cfg_options'],
                             scalars=scalars[name]) for name, variant in args.variants.items()},
        machine=describe_machine(), initial_weights=initial, blocks=blocks_of(curves[args.reference]), curves=curves,
        separation=rows)
    with open(osp.join(args.out_dir, 'training_dynamics.json'), 'w') as f:
        json.dump(result, f, indent=1)
    print(markdown)
    print('wrote ' + ', '.join([osp.join(args.out_dir, 'training_dynamics.json'),
                                osp.join(args.out_dir, 'training_dynamics.md'), *written]))
