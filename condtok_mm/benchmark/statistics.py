"""The statistics of a suite over seeds: means, paired differences with 95 % t intervals, each variant's best
learning rate, and the per-rate and best-rate rows of the report."""
import math
import statistics

from scipy import stats

REPORTED_METRICS = {'coco/bbox_mAP': 'bbox AP', 'coco/segm_mAP': 'segm AP'}  # fractions; reported in percent


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
    return {cell.seed: cell.results['metrics'][metric] for cell in cells
            if cell.variant == variant and cell.lr == lr and metric in cell.results.get('metrics', {})}


def best_lr(cells, variant, metric):
    """The variant's rate with the best mean metric over its seeds (None while none finished)."""
    by_lr = {}
    for cell in cells:
        if cell.variant == variant and metric in (cell.results or {}).get('metrics', {}):
            by_lr.setdefault(cell.lr, []).append(cell.results['metrics'][metric])
    return max(by_lr, key=lambda lr: statistics.fmean(by_lr[lr])) if by_lr else None


def reported_metrics(metric):
    """The suite's metric first, then the others the report shows."""
    return [metric] + [key for key in REPORTED_METRICS if key != metric]


def aggregate(suite, cells):
    """(rows, best): a row per variant and rate, and each variant's best-rate row with its paired difference
    to the reference's best-rate row."""
    reference, metric = suite.reference, suite.metric
    metrics = reported_metrics(metric)
    rows = []
    for variant in suite.variants:
        for lr in sorted({cell.lr for cell in cells if cell.variant == variant}):
            group = [cell for cell in cells if cell.variant == variant and cell.lr == lr]
            done = [cell for cell in group if 'metrics' in cell.results]
            row = dict(variant=variant, lr=lr, seeds=sorted(cell.seed for cell in done),
                       failed=sorted(cell.seed for cell in group if cell.status == 'failed'),
                       plateaued=sorted(cell.seed for cell in group if cell.results.get('plateaued')),
                       diverged=sorted(cell.seed for cell in group if cell.results.get('diverged')),
                       metrics={}, difference={})
            for key in metrics:
                values = metric_by_seed(cells, variant, lr, key)
                if values:
                    row['metrics'][key] = mean_std(list(values.values()))
                    if variant != reference:
                        row['difference'][key] = paired_difference(values, metric_by_seed(cells, reference, lr, key))
            losses = [cell.results['final_loss'] for cell in done if 'final_loss' in cell.results]
            row['final_loss'] = mean_std(losses) if losses else None
            rows.append(row)
    best = []
    reference_lr = best_lr(cells, reference, metric)
    for variant in suite.variants:
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
