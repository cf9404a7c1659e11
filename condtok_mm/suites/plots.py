"""The figures of a suite: the metric against the learning rate; each reported seed's metric in every variant at
its chosen rate, and the validations during training; the loss and kappa curves at each variant's chosen rate.
matplotlib is imported when a figure is drawn."""
import statistics

from condtok_mm.utils import write_whole
from .results import KAPPA_CURVES
from .statistics import REPORTED_METRICS


def seed_lines(best, metric):
    """{seed: [(variant index, value), ...]}: each reported seed's ``metric`` in the variants (at their chosen
    rates, in the suite's order) that have it, so that a line joins one seed's initial weights across them."""
    lines = {}
    for i, entry in enumerate(best):
        stat = entry['metrics'].get(metric) or dict(seeds=[], values=[])
        for seed, value in zip(stat['seeds'], stat['values']):
            lines.setdefault(seed, []).append((i, value))
    return dict(sorted(lines.items()))


def validation_curves(validation):
    """{variant: (epochs, means, minima, maxima)} of the validations during training (report.validation_rows)."""
    curves = {}
    for row in validation:
        if row['metric'] is None:
            continue
        epochs, means, lows, highs = curves.setdefault(row['variant'], ([], [], [], []))
        epochs.append(row['epoch'])
        means.append(row['metric']['mean'])
        lows.append(min(row['metric']['values']))
        highs.append(max(row['metric']['values']))
    return curves


def up_to(curve, last):
    """The curve's points at iterations up to ``last``."""
    points = [(i, v) for i, v in zip(curve['iter'], curve['value']) if i <= last]
    return dict(iter=[i for i, _ in points], value=[v for _, v in points])


def save(fig, path, dpi):
    """The figure ``fig`` at ``dpi`` dots per inch as the whole of the PNG file ``path``
    (:func:`~condtok_mm.utils.write_whole`)."""
    write_whole(path, lambda temporary: fig.savefig(temporary, format='png', dpi=dpi))


def plot(suite, cells, rows, best, validation, paths):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    metric = suite.metric
    colours = {variant: f'C{i % 10}' for i, variant in enumerate(suite.variants)}
    fig, ax = plt.subplots(figsize=(7.5, 4.8), constrained_layout=True)
    for variant in suite.variants:
        points = [row for row in rows if row['variant'] == variant and metric in row['metrics']
                  and row['role'] == ('selection' if suite.selection_seeds else 'report')]
        if not points:
            continue
        ax.errorbar([row['lr'] for row in points], [row['metrics'][metric]['mean'] for row in points],
                    yerr=[row['metrics'][metric]['std'] or 0 for row in points], fmt='o-', capsize=3,
                    color=colours[variant], label=variant)
    ax.set_xscale('log')
    ax.set_xlabel('learning rate')
    ax.set_ylabel(f'{REPORTED_METRICS.get(metric, metric)} (mean ± std over seeds)')
    ax.set_title(f'{suite.name}: {REPORTED_METRICS.get(metric, metric)} against the learning rate', fontsize=10)
    ax.grid(True, which='both', alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    save(fig, paths['ap_vs_lr.png'], dpi=120)
    plt.close(fig)

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8), constrained_layout=True)
    name = REPORTED_METRICS.get(metric, metric)
    for seed, points in seed_lines(best, metric).items():
        left.plot([i for i, _ in points], [value for _, value in points], 'o-', color='0.6', alpha=0.7,
                  markersize=4, linewidth=1)
        left.annotate(f'seed {seed}', points[-1], xytext=(4, 0), textcoords='offset points', fontsize=7,
                      color='0.4', va='center')
    for i, entry in enumerate(best):
        stat = entry['metrics'].get(metric)
        if stat:
            left.plot([i], [stat['mean']], 'D', color=colours[entry['variant']], markersize=8, zorder=3)
    left.set_xticks(range(len(best)), [f'{entry["variant"]}\nlr {entry["lr"]:g}' for entry in best], fontsize=8)
    left.set_ylabel(f'{name}, final (reported seeds; diamond: mean)')
    left.set_title('each seed across the variants (same initial weights per seed)', fontsize=10)
    left.grid(True, axis='y', alpha=0.3)
    curves = validation_curves(validation)
    for variant, (epochs, means, lows, highs) in curves.items():
        right.plot(epochs, means, 'o-', color=colours[variant], label=variant)
        right.fill_between(epochs, lows, highs, color=colours[variant], alpha=0.15, linewidth=0)
    right.set_xticks(sorted({epoch for epochs, *_ in curves.values() for epoch in epochs}))
    right.set_xlabel('epoch')
    right.set_ylabel(f'{name} (mean over reported seeds, band min-max)')
    right.set_title('validations during training', fontsize=10)
    right.grid(True, alpha=0.3)
    if right.get_legend_handles_labels()[0]:
        right.legend(fontsize=8)
    fig.suptitle(f'{suite.name}: {name} by seed and during training', fontsize=10)
    save(fig, paths['seeds.png'], dpi=110)
    plt.close(fig)

    def draw(ax, curve_of):
        """Each variant's curve at its best rate: mean over seeds, band min-max."""
        for entry in best:
            curves = [curve_of(cell.results) for cell in cells if cell.variant == entry['variant']
                      and cell.lr == entry['lr'] and suite.role(cell.seed) == 'report']
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

    first = suite.early_loss
    fig, axes = plt.subplots(1, 2 if first else 1, figsize=(15 if first else 7.5, 4.8), squeeze=False,
                             constrained_layout=True)
    draw(axes[0, 0], lambda results: results['loss'])
    if first:  # the early-loss endpoint's iterations, where a spike at the switch-on would be
        draw(axes[0, 1], lambda results: up_to(results['loss'], first))
        axes[0, 1].set_title(f'iterations 1-{first} (the early-loss endpoint)', fontsize=10)
    axes[0, 0].set_ylabel('training loss (mean over seeds, band min-max)')
    fig.suptitle(f'{suite.name}: training loss at each variant\'s reported learning rate', fontsize=10)
    save(fig, paths['loss.png'], dpi=120)
    plt.close(fig)

    fig, axes = plt.subplots(1, len(KAPPA_CURVES), figsize=(6 * len(KAPPA_CURVES), 4.8), constrained_layout=True)
    for ax, (key, title) in zip(axes, KAPPA_CURVES.items()):
        draw(ax, lambda results: results['kappa'][key])
        ax.set_yscale('log')
        ax.set_ylabel(f'kappa ({key})')
        ax.set_title(title, fontsize=10)
    fig.suptitle(f'{suite.name}: condition numbers during training at each variant\'s reported learning rate',
                 fontsize=10)
    save(fig, paths['kappa.png'], dpi=110)
    plt.close(fig)
