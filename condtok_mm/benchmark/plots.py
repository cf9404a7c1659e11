"""The figures of a suite: the metric against the learning rate, and the loss and kappa curves at each variant's
best rate. matplotlib is imported when a figure is drawn."""
import statistics

from .results import KAPPA_CURVES
from .statistics import REPORTED_METRICS


def plot(suite, cells, rows, best, paths):
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
    fig.savefig(paths['ap_vs_lr.png'], dpi=120)
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

    fig, ax = plt.subplots(figsize=(7.5, 4.8), constrained_layout=True)
    draw(ax, lambda results: results['loss'])
    ax.set_ylabel('training loss (mean over seeds, band min-max)')
    ax.set_title(f'{suite.name}: training loss at each variant\'s best learning rate', fontsize=10)
    fig.savefig(paths['loss.png'], dpi=120)
    plt.close(fig)

    fig, axes = plt.subplots(1, len(KAPPA_CURVES), figsize=(6 * len(KAPPA_CURVES), 4.8), constrained_layout=True)
    for ax, (key, title) in zip(axes, KAPPA_CURVES.items()):
        draw(ax, lambda results: results['kappa'][key])
        ax.set_yscale('log')
        ax.set_ylabel(f'kappa ({key})')
        ax.set_title(title, fontsize=10)
    fig.suptitle(f'{suite.name}: condition numbers during training at each variant\'s best learning rate',
                 fontsize=10)
    fig.savefig(paths['kappa.png'], dpi=110)
    plt.close(fig)
