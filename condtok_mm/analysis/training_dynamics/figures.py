"""The comparison's figures: each block quantity with a panel per block and a curve per variant, the global
quantities, and each variant's log2 ratio to the reference as block x iteration heatmaps. matplotlib is imported
when a figure is drawn."""
import math

import numpy as np

from condtok_mm.engine.hooks.training_dynamics import BLOCK_QUANTITIES
from .separation import GLOBAL_QUANTITIES, log2_ratio

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


def _pyplot():
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    return plt


def _grid(count):
    columns = min(count, 4)
    return math.ceil(count / columns), columns


def plot_block_quantity(curves, quantity, blocks, path, interval):
    """One panel per block of ``quantity``, a curve per variant of ``curves`` ({variant: curves}), to ``path``;
    ``interval``: the recording interval, for the title."""
    plt = _pyplot()
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
    """The loss and the total gradient norm of every variant of ``curves`` ({variant: curves}), to ``path``."""
    plt = _pyplot()
    quantities = [q for q in GLOBAL_QUANTITIES if any(q in c for c in curves.values())]
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


def plot_ratio(curves, reference, name, blocks, factor, path):
    """Heatmaps of log2(``name`` / ``reference``), block x iteration, one per block quantity, and the global ones,
    to ``path``; the colour scale spans at least twice log2(``factor``)."""
    plt = _pyplot()
    ref_curves, var_curves = curves[reference], curves[name]
    panels = []
    for quantity in BLOCK_QUANTITIES:
        present = [b for b in blocks if f'{quantity}/{b}' in ref_curves and f'{quantity}/{b}' in var_curves]
        if present:
            panels.append((QUANTITY_TITLES[quantity], present, [f'{quantity}/{b}' for b in present]))
    global_keys = [q for q in GLOBAL_QUANTITIES if q in ref_curves and q in var_curves]
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
