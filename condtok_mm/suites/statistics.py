"""The statistics of a suite over seeds: means with the per-seed values, paired differences with a 95 % t
interval and an exact sign-flip p-value, Holm's correction over a declared family, and each variant's chosen
learning rate (on the selection seeds where the suite has them)."""
import itertools
import math
import statistics

import numpy as np
from scipy import stats

REPORTED_METRICS = {'coco/bbox_mAP': 'bbox AP', 'coco/segm_mAP': 'segm AP'}  # fractions; reported in percent
MAX_EXACT_SEEDS = 20  # 2^20 sign flips: the exact test's limit here
# of the size of the values summed: far above float64 rounding of a sum of 20 terms, far below a rounded AP's step
TIE_TOLERANCE = 1e-9


def mean_std(values):
    """Mean, sample std (None for one value) and count; non-finite values (a diverged loss) are left out."""
    values = [value for value in values if math.isfinite(value)]
    if not values:
        return None
    return dict(mean=statistics.fmean(values), std=statistics.stdev(values) if len(values) > 1 else None,
                n=len(values))


def sign_flip_p(differences):
    """Exact two-sided p-value of the paired sign-flip (permutation) test of ``differences`` (one per seed):
    the share of the 2^n sign patterns s whose |sum s_i d_i| is at least the observed |sum d_i|. Under the
    null of no difference each seed's sign is as likely flipped; with n seeds no p is below 2 / 2^n.

    Every pattern is counted. A pattern's sum that equals the observed one in exact arithmetic can differ from it
    by float rounding (differences of APs rounded to three decimals tie often), so sums within TIE_TOLERANCE x
    sum |d_i| of the observed count as ties; a tolerance relative to the observed sum alone (scipy's
    permutation_test) misses such ties when that sum is near zero."""
    d = np.asarray(differences, dtype=np.float64)
    if d.size == 0:
        return None
    if d.size > MAX_EXACT_SEEDS:
        raise ValueError(f'the exact sign-flip test enumerates 2^n patterns; {d.size} differences are more than '
                         f'{MAX_EXACT_SEEDS}')
    threshold = abs(d.sum()) - TIE_TOLERANCE * np.abs(d).sum()
    # the sums of every sign pattern of the first (at most 16) differences at once, the rest one pattern at a time
    head, tail = d[:16], d[16:]
    head_signs = 1 - 2 * ((np.arange(2**head.size)[:, None] >> np.arange(head.size)) & 1)
    head_sums = head_signs @ head
    as_extreme = sum(int(np.count_nonzero(np.abs(head_sums + np.dot(signs, tail)) >= threshold))
                     for signs in itertools.product((1.0, -1.0), repeat=tail.size))
    return as_extreme / 2**d.size


def paired_difference(values, reference):
    """The per-seed differences values - reference on their common seeds: mean, 95 % t interval (None below 2
    seeds; scipy's one-sample t test), the exact sign-flip p-value and the differences themselves."""
    seeds = sorted(set(values) & set(reference))
    if not seeds:
        return None
    differences = [values[seed] - reference[seed] for seed in seeds]
    mean = statistics.fmean(differences)
    result = dict(mean=mean, low=None, high=None, n=len(differences), seeds=seeds, p=sign_flip_p(differences),
                  per_seed=differences)
    if len(differences) > 1:
        if statistics.stdev(differences) == 0:  # scipy's t statistic is undefined; the interval is the point
            result.update(low=mean, high=mean)
        else:
            interval = stats.ttest_1samp(differences, 0.0).confidence_interval(0.95)
            result.update(low=float(interval.low), high=float(interval.high))
    return result


def holm(pvalues):
    """{name: Holm-adjusted p} of {name: p}: the i-th smallest of m p-values times (m - i + 1), made
    non-decreasing in that order and capped at 1 (Holm 1979; controls the family-wise error rate)."""
    order = sorted(pvalues, key=lambda name: pvalues[name])
    adjusted, running = {}, 0.0
    for i, name in enumerate(order):
        running = max(running, min(1.0, (len(order) - i) * pvalues[name]))
        adjusted[name] = running
    return adjusted


def metric_by_seed(cells, variant, lr, metric, seeds=None):
    """{seed: value} of the variant's finished cells at ``lr`` (on ``seeds`` where given)."""
    return {cell.seed: cell.results['metrics'][metric] for cell in cells
            if cell.variant == variant and cell.lr == lr and metric in (cell.results or {}).get('metrics', {})
            and (seeds is None or cell.seed in seeds)}


def below(value, bound, scale):
    """Whether ``value`` is below ``bound`` by more than float rounding: a value computed from metrics that are
    rounded decimals (CocoMetric's three decimals of a fraction) can miss a bound it equals in exact arithmetic by
    a few ulps on either side, and then counts as equal to it. ``scale``: the size of the metrics it was computed
    from (the rounding is relative to them)."""
    return value < bound - TIE_TOLERANCE * scale


def best_lr(cells, variant, metric, seeds=None):
    """The variant's rate with the best mean metric over its seeds (``seeds`` where given; None while none
    finished); a tie, equal means in exact arithmetic (:func:`below`), goes to the smaller rate."""
    by_lr = {}
    for cell in cells:
        if (cell.variant == variant and metric in (cell.results or {}).get('metrics', {})
                and (seeds is None or cell.seed in seeds)):
            by_lr.setdefault(cell.lr, []).append(cell.results['metrics'][metric])
    if not by_lr:
        return None
    means = {lr: statistics.fmean(values) for lr, values in by_lr.items()}
    best = max(means.values())
    scale = max(abs(value) for values in by_lr.values() for value in values)
    return min(lr for lr, mean in means.items() if not below(mean, best, scale))


def reported_metrics(metric):
    """The suite's metric first, then the others the report shows."""
    return [metric] + [key for key in REPORTED_METRICS if key != metric]
