"""The suite runner's statistics (condtok_mm/suites/statistics.py, tables.py, results.py) against numpy and
scipy computed by hand: the exact paired sign-flip p-value, Holm's correction, a rate chosen on the selection
seeds and reported on the others (a tie of means in exact arithmetic going to the smaller rate), per-arm
references, and plateau escape on written runs."""
import itertools
import json
import math
import statistics
from types import SimpleNamespace

import numpy as np
import pytest
from scipy import stats

from condtok_mm.suites.results import escape_iteration
from condtok_mm.suites.schema import EscapeRule, SuiteError, load_suite
from condtok_mm.suites.statistics import best_lr, holm, paired_difference, sign_flip_p
from helpers.repo import REPO_ROOT
from helpers.suite_runs import BASELINE, CONDITIONED, record_fingerprints, run_runner, write_cell


def scipy_sign_flip(differences):
    """scipy's exact permutation test of one sample: every sign pattern (n_resamples=inf)."""
    return stats.permutation_test((np.asarray(differences),), np.mean, permutation_type='samples',
                                  alternative='two-sided', n_resamples=np.inf).pvalue


@pytest.mark.parametrize('differences', [[1.0, 2.0, 3.0], [0.5, -0.2, 1.3, 2.2, -0.1, 0.9], [2.0, -2.0],
                                         [1.5, 1.5, 1.5, 1.5, 1.5, 1.5, 1.5, 1.5], [0.0, 0.0, 0.0]])
def test_sign_flip_p_is_scipys_exact_permutation_test(differences):
    p = sign_flip_p(differences)
    assert p == pytest.approx(scipy_sign_flip(differences), abs=1e-12)
    # and the count itself, over all 2^n patterns in float64
    d = np.asarray(differences, dtype=np.float64)
    flips = [abs(np.dot(signs, d)) for signs in itertools.product((1, -1), repeat=d.size)]
    assert p == pytest.approx(np.mean([flip >= abs(d.sum()) - 1e-9 for flip in flips]))


def test_sign_patterns_that_tie_the_observed_sum_only_in_exact_arithmetic_count_as_ties():
    # test APs as CocoMetric rounds them (three decimals of a fraction), in percent: float rounding leaves the
    # observed sum and patterns equal to it a few ulps apart, and near a zero sum scipy's tolerance (relative to
    # the observed sum) misses them
    baseline = [0.182, 0.102, 0.294, 0.316, 0.351, 0.185]
    variant = [0.177, 0.104, 0.302, 0.300, 0.354, 0.197]
    differences = [100 * v - 100 * b for v, b in zip(variant, baseline)]
    per_mille = [round(1000 * v) - round(1000 * b) for v, b in zip(variant, baseline)]  # exact integers
    exact = np.mean([abs(np.dot(signs, per_mille)) >= abs(sum(per_mille))
                     for signs in itertools.product((1, -1), repeat=len(per_mille))])
    assert exact == 29 / 32 and scipy_sign_flip(differences) == pytest.approx(28 / 32)  # scipy misses a tie
    assert sign_flip_p(differences) == exact


def test_twenty_seeds_are_counted_exactly():
    d = np.linspace(-1.0, 2.0, 20)  # no ties: every pattern's sum is distinct from the observed one
    p = sign_flip_p(d)
    signs = 1 - 2 * ((np.arange(2**20)[:, None] >> np.arange(20)) & 1)
    assert p == np.mean(np.abs(signs @ d) >= abs(d.sum()) - 1e-9)


def test_a_tie_of_mean_metrics_goes_to_the_smaller_rate_in_whatever_order_the_cells_come():
    def cell(lr, seed, ap):
        return SimpleNamespace(variant='B', lr=lr, seed=seed, results=dict(metrics={'coco/bbox_mAP': ap}))

    cells = [cell(4e-3, 0, 0.30), cell(4e-3, 1, 0.20), cell(1e-3, 0, 0.25), cell(1e-3, 1, 0.25), cell(5e-4, 0, 0.1)]
    assert best_lr(cells, 'B', 'coco/bbox_mAP') == 1e-3
    assert best_lr(cells[::-1], 'B', 'coco/bbox_mAP') == 1e-3
    assert best_lr(cells, 'B', 'coco/bbox_mAP', seeds=[0]) == 4e-3


@pytest.mark.parametrize('smaller, larger', [((0.300, 0.300), (0.322, 0.278)), ((0.322, 0.278), (0.300, 0.300))])
def test_means_equal_in_exact_arithmetic_but_not_in_float_are_a_tie_that_goes_to_the_smaller_rate(smaller, larger):
    # APs as CocoMetric rounds them (three decimals of a fraction), read in percent: both rates' sums are 60.0 AP,
    # but float rounding puts mean(32.2, 27.8) one ulp above mean(30.0, 30.0)
    def cell(lr, seed, ap):
        return SimpleNamespace(variant='B', lr=lr, seed=seed, results=dict(metrics={'coco/bbox_mAP': 100 * ap}))

    means = {lr: statistics.fmean([100 * ap for ap in aps]) for lr, aps in ((1e-3, smaller), (2e-3, larger))}
    assert means[1e-3] != means[2e-3]  # what the float comparison alone would decide on
    cells = [cell(lr, seed, ap) for lr, aps in ((1e-3, smaller), (2e-3, larger)) for seed, ap in enumerate(aps)]
    cells.append(cell(5e-4, 0, 0.250))
    assert best_lr(cells, 'B', 'coco/bbox_mAP') == 1e-3
    assert best_lr(cells[::-1], 'B', 'coco/bbox_mAP') == 1e-3
    # a mean one rounded AP step (0.1 AP over two seeds) above the other is no tie
    cells.append(cell(2e-3, 2, 0.301))
    cells.append(cell(1e-3, 2, 0.300))
    assert best_lr(cells, 'B', 'coco/bbox_mAP') == 2e-3


def test_three_seeds_cannot_go_below_a_quarter_and_too_many_are_refused():
    assert sign_flip_p([1.0, 2.0, 3.0]) == 0.25  # all three positive: 2 of 8 patterns as extreme
    assert sign_flip_p([3.0]) == 1.0 and sign_flip_p([]) is None
    with pytest.raises(ValueError, match='21 differences are more than 20'):
        sign_flip_p(list(range(1, 22)))


def test_the_p_value_is_paired_by_seed():
    # the seed effect (shared by both arms) dwarfs the difference: paired, the +1 on every seed is as extreme
    # as it gets; unpaired, the two samples overlap entirely
    reference = {0: 10.0, 1: 20.0, 2: 30.0, 3: 40.0, 4: 50.0}
    values = {seed: value + 1.0 + 0.01 * seed for seed, value in reference.items()}
    difference = paired_difference(values, reference)
    expected = scipy_sign_flip([values[s] - reference[s] for s in sorted(values)])
    assert difference['p'] == pytest.approx(expected) and expected == pytest.approx(2 / 32)
    unpaired = stats.permutation_test((list(values.values()), list(reference.values())),
                                      lambda x, y: np.mean(x) - np.mean(y), permutation_type='independent',
                                      n_resamples=np.inf).pvalue
    assert unpaired > 0.5  # what an unpaired test would say
    assert difference['per_seed'] == pytest.approx([1.0 + 0.01 * s for s in range(5)])
    half = stats.t.ppf(0.975, 4) * np.std(difference['per_seed'], ddof=1) / np.sqrt(5)
    assert (difference['low'], difference['high']) == pytest.approx((difference['mean'] - half,
                                                                     difference['mean'] + half))
    only = {1: values[1]}
    assert paired_difference(only, reference)['seeds'] == [1]  # only the common seeds pair


def holm_by_hand(pvalues):
    """Holm's step-down adjustment written out: sorted ascending, (m - i) p_(i), running maximum, capped."""
    names = sorted(pvalues, key=pvalues.get)
    p = np.array([pvalues[name] for name in names])
    adjusted = np.minimum(1.0, np.maximum.accumulate((len(p) - np.arange(len(p))) * p))
    return dict(zip(names, adjusted))


def test_holm_adjusts_in_ascending_order_with_a_running_maximum():
    # worked example: 0.005 x 4 = 0.02; 0.01 x 3 = 0.03; 0.03 x 2 = 0.06; 0.04 x 1 = 0.04 -> kept at 0.06
    assert holm(dict(a=0.01, b=0.04, c=0.03, d=0.005)) == pytest.approx(dict(a=0.03, b=0.06, c=0.06, d=0.02))
    rng = np.random.default_rng(0)
    for m in (1, 2, 5, 9):
        pvalues = {f'v{i}': float(p) for i, p in enumerate(rng.uniform(0, 0.6, m))}
        assert holm(pvalues) == pytest.approx(holm_by_hand(pvalues))
    assert holm(dict(a=0.5, b=0.6)) == dict(a=1.0, b=1.0)


# ---------------------------------------------------------------- a suite with selection seeds, on written runs

SELECTION, REPORTED = (0, 1, 2), (3, 4, 5, 6)
FALLING = [3.0, 2.6, 2.3, 2.1, 2.0, 2.0, 1.9, 1.7, 1.5, 1.3, 1.2, 1.1]


def bbox_of(variant, lr, seed):
    """bbox AP (fraction): on the selection seeds A is better at 1e-3, on the reported seeds at 2.5e-4 (so that a
    rate chosen on the reported seeds would be the other one); B and D differ from A by a seed-dependent gain."""
    if variant == 'A':
        if seed in SELECTION:
            return (0.05 if lr == 1e-3 else 0.03) + 0.002 * seed
        return (0.04 if lr == 1e-3 else 0.09) + 0.003 * seed * seed
    gain = dict(B=[0.02, 0.01, 0.03, 0.015], D=[0.0, -0.01, 0.005, 0.002], M_base=[0, 0, 0, 0],
                M_cond=[0.03, -0.02, 0.01, 0.05])[variant][REPORTED.index(seed)]
    base = 0.04 + 0.003 * seed * seed if not variant.startswith('M') else 0.2 + 0.01 * seed
    return base + gain


def selection_suite(tmp_path, family=("'B'", "'D'")):
    out_dir = tmp_path / 'out'
    cells = [('A', lr, seed) for lr in (2.5e-4, 1e-3) for seed in SELECTION + REPORTED]  # every A cell there is
    cells += [(variant, 1e-3, seed) for variant in ('B', 'D', 'M_base', 'M_cond') for seed in REPORTED]
    for variant, lr, seed in cells:
        write_cell(str(out_dir), variant, lr, seed, bbox_of(variant, lr, seed), bbox_of(variant, lr, seed) / 2,
                   FALLING)
    path = tmp_path / 'selection.py'
    path.write_text(
        f"reference = 'A'\nselection_seeds = {list(SELECTION)}\nseeds = {list(REPORTED)}\nlrs = [1e-3]\n"
        f"family = [{', '.join(family)}]\ncfg_options = {{'train_cfg.max_epochs': 1}}\n"
        f"variants = dict(A=dict(config={BASELINE!r}, lrs=[2.5e-4, 1e-3]), B=dict(config={CONDITIONED!r}),\n"
        f"    D=dict(config={CONDITIONED!r}, cfg_options={{'model.backbone.conditioning.control': 'norm_matched'}}),\n"
        f"    M_base=dict(config={BASELINE!r}, reference=None, cfg_options={{'model.backbone.drop_path_rate': 0.2}}),\n"
        f"    M_cond=dict(config={CONDITIONED!r}, reference='M_base'))\n")
    record_fingerprints(path, out_dir)
    result = run_runner(str(path), '--out-dir', str(out_dir), '--gather-only')
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return json.loads((out_dir / 'suite.json').read_text()), (out_dir / 'suite.md').read_text()


def test_the_rate_is_chosen_on_the_selection_seeds_and_reported_on_the_others(tmp_path):
    summary, table = selection_suite(tmp_path)
    cells = {(c['variant'], c['lr'], c['seed']) for c in summary['cells_detail']}
    # A ran every rate on the selection seeds, and only the chosen one on the reported seeds
    selection_means = {lr: np.mean([bbox_of('A', lr, s) for s in SELECTION]) for lr in (2.5e-4, 1e-3)}
    chosen = max(selection_means, key=selection_means.get)
    assert chosen == 1e-3  # the reported seeds would have chosen 2.5e-4
    assert {('A', lr, s) for lr in (2.5e-4, 1e-3) for s in SELECTION} | {('A', chosen, s) for s in REPORTED} == {
        cell for cell in cells if cell[0] == 'A'}
    best = {entry['variant']: entry for entry in summary['best']}
    assert best['A']['lr'] == chosen and best['A']['chosen_on'] == 'selection seeds'
    assert best['A']['seeds'] == list(REPORTED)
    reported = [100 * bbox_of('A', chosen, s) for s in REPORTED]
    assert best['A']['metrics']['coco/bbox_mAP']['mean'] == pytest.approx(np.mean(reported))
    assert best['A']['metrics']['coco/bbox_mAP']['values'] == pytest.approx(reported)
    for variant in ('B', 'D'):
        differences = [100 * (bbox_of(variant, 1e-3, s) - bbox_of('A', chosen, s)) for s in REPORTED]
        difference = best[variant]['difference']['coco/bbox_mAP']
        half = stats.t.ppf(0.975, 3) * np.std(differences, ddof=1) / 2
        assert (difference['mean'], difference['low'], difference['high']) == pytest.approx(
            (np.mean(differences), np.mean(differences) - half, np.mean(differences) + half))
        assert difference['p'] == pytest.approx(scipy_sign_flip(differences))
        assert best[variant]['chosen_on'] == 'fixed'
    # the per-rate rows are those of the selection seeds
    selection_rows = [row for row in summary['rows'] if row['role'] == 'selection']
    assert [(row['variant'], row['lr'], row['seeds']) for row in selection_rows] == [
        ('A', 2.5e-4, list(SELECTION)), ('A', 1e-3, list(SELECTION))]
    assert 'chosen on the selection seeds (0, 1, 2), reported on the seeds 3, 4, 5, 6' in table
    a = best['A']['metrics']['coco/bbox_mAP']
    assert (f'| A | 0.001 | selection seeds | 3, 4, 5, 6 | {a["mean"]:.1f} ± {a["std"]:.1f} ('
            + ' / '.join(f'{v:.1f}' for v in reported) + ') |') in table


def test_a_suite_whose_every_rate_is_fixed_says_so_and_not_that_a_choice_biased_it(tmp_path):
    """The decisive suites fix every arm's rate in advance: the chosen-rate table must not say that a choice made on
    the reported seeds biased its differences (it would with one tuned arm)."""
    out_dir = tmp_path / 'out'
    for variant, lr in (('A', 2.5e-4), ('B', 1e-3)):
        for seed in REPORTED:
            write_cell(str(out_dir), variant, lr, seed, bbox_of(variant, lr, seed), bbox_of(variant, lr, seed) / 2,
                       FALLING)
    path = tmp_path / 'fixed.py'
    path.write_text(f"reference = 'A'\nseeds = {list(REPORTED)}\ncfg_options = {{'train_cfg.max_epochs': 1}}\n"
                    f"variants = dict(A=dict(config={BASELINE!r}, lrs=[2.5e-4]), B=dict(config={CONDITIONED!r}, "
                    f"lrs=[1e-3]))\n")
    record_fingerprints(path, out_dir)
    result = run_runner(str(path), '--out-dir', str(out_dir), '--gather-only')
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    table = (out_dir / 'suite.md').read_text()
    assert "Each variant at its one learning rate, fixed in advance of these runs; Δ: paired by seed" in table
    assert 'biased upwards' not in table and 'chosen on the reported seeds' not in table
    assert '| B | 0.001 | fixed |' in table


def test_holm_over_the_declared_family_and_each_arm_against_its_own_reference(tmp_path):
    summary, table = selection_suite(tmp_path)
    best = {entry['variant']: entry for entry in summary['best']}
    pvalues = {variant: scipy_sign_flip([100 * (bbox_of(variant, 1e-3, s) - bbox_of('A', 1e-3, s))
                                         for s in REPORTED]) for variant in ('B', 'D')}
    adjusted = holm_by_hand(pvalues)
    assert {v: best[v]['p_holm'] for v in ('B', 'D')} == pytest.approx(adjusted)
    assert best['M_cond']['p_holm'] is None  # outside the family
    # the M pair: M_cond against its own baseline twin, M_base compared with nothing
    differences = [100 * (bbox_of('M_cond', 1e-3, s) - bbox_of('M_base', 1e-3, s)) for s in REPORTED]
    assert best['M_cond']['reference'] == 'M_base'
    assert best['M_cond']['difference']['coco/bbox_mAP']['mean'] == pytest.approx(np.mean(differences))
    assert best['M_cond']['difference']['coco/bbox_mAP']['per_seed'] == pytest.approx(differences)
    assert best['M_base']['difference'] == {} and best['M_base']['reference'] is None
    assert '| M_cond (vs M_base) | 0.001 | fixed |' in table
    assert 'Holm: adjusted over the family B, D' in table


def test_a_suite_with_a_seed_in_both_sets_or_a_family_without_a_comparison_is_refused(tmp_path):
    path = tmp_path / 's.py'
    path.write_text(f"reference = 'A'\nselection_seeds = [0, 1]\nseeds = [1, 2]\nlrs = [1e-3]\n"
                    f"variants = dict(A=dict(config={BASELINE!r}))\n")
    with pytest.raises(SuiteError, match=r"seeds \[1\] are in both selection_seeds and seeds"):
        load_suite(str(path), REPO_ROOT)
    path.write_text(f"reference = 'A'\nseeds = [1, 2]\nlrs = [1e-3]\nfamily = ['A']\n"
                    f"variants = dict(A=dict(config={BASELINE!r}))\n")
    with pytest.raises(SuiteError, match="family names 'A', which is not a variant compared with a reference"):
        load_suite(str(path), REPO_ROOT)


# ---------------------------------------------------------------- plateau escape

def smoothed_by_hand(losses, window):
    return [np.mean(losses[max(0, i - window + 1):i + 1]) for i in range(len(losses))]


STALLED = [4.0, 3.2, 2.6, 2.3, 2.1, 2.05, 2.02, 2.0, 2.03, 1.98, 2.01, 2.0, 1.99, 2.02, 2.0, 1.97, 2.0, 2.01, 1.98, 2.0]
ESCAPING = STALLED[:10] + [1.9, 1.75, 1.6, 1.45, 1.3, 1.2, 1.1, 1.0, 0.95, 0.9]


@pytest.mark.parametrize('losses, escapes', [(STALLED, False), (ESCAPING, True)])
def test_escape_is_the_first_iteration_after_warm_up_below_the_plateau_by_the_margin(losses, escapes):
    iters = [10 * (i + 1) for i in range(len(losses))]
    iteration, plateau, threshold = escape_iteration(iters, losses, 50, EscapeRule(margin=0.2, window=5))
    start = iters.index(50)
    level = np.mean(losses[start:start + 5])  # the first 5 losses from the warm-up's end: 2.1 ... 2.03
    assert plateau == pytest.approx(level) and threshold == pytest.approx(0.8 * level)
    smoothed = smoothed_by_hand(losses, 5)
    expected = next((iters[i] for i in range(start + 1, len(iters)) if smoothed[i] <= 0.8 * level), None)
    assert iteration == expected and (expected is not None) == escapes
    if escapes:  # 1.9 1.75 1.6 1.45 1.3 average 1.6, the first trailing mean <= 0.8 x 2.04 = 1.632
        assert iteration == 150
    # the rule's own warm-up end wins over the config's; after the last logged loss there is nothing to judge
    assert escape_iteration(iters, losses, 50, EscapeRule(after=1000)) == (None, None, None)


def test_escape_counts_and_iterations_in_the_gathered_rows(tmp_path):
    out_dir = tmp_path / 'out'
    curves = {0: ESCAPING, 1: STALLED, 2: ESCAPING[:12] + [float('nan')] * 8}
    for seed, losses in curves.items():
        write_cell(str(out_dir), 'A', 1e-3, seed, 0.1, 0.05, losses)
    path = tmp_path / 's.py'
    path.write_text(f"reference = 'A'\nseeds = [0, 1, 2]\nlrs = [1e-3]\nescape = dict(margin=0.2, window=5)\n"
                    f"cfg_options = {{'train_cfg.max_epochs': 1, 'param_scheduler.0.end': 50}}\n"
                    f"variants = dict(A=dict(config={BASELINE!r}))\n")
    record_fingerprints(path, out_dir)
    result = run_runner(str(path), '--out-dir', str(out_dir), '--gather-only')
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    row, = json.loads((out_dir / 'suite.json').read_text())['rows']
    iters = [10 * (i + 1) for i in range(20)]
    expected = {seed: escape_iteration(iters, losses, 50, EscapeRule())[0] for seed, losses in curves.items()}
    assert expected[0] is not None and expected[1] is None
    assert row['escape_iteration'] == {str(seed): it for seed, it in expected.items()}
    assert row['escaped'] == sorted(seed for seed, it in expected.items() if it is not None)
    assert row['diverged'] == [2]
    # a diverged run's final loss (NaN) is left out of the mean, not a crash
    assert row['final_loss']['mean'] == pytest.approx(np.mean([ESCAPING[-1], STALLED[-1]]))
    assert math.isnan(json.loads((out_dir / 'suite.json').read_text())['cells_detail'][2]['results']['final_loss'])


# ---------------------------------------------------------------- the early-loss endpoint

def early_curve(seed, spike):
    """40 logged losses (every 10 iterations: 10 ... 400); ``spike`` added to the first 5 (iterations 10-50)."""
    return [3.0 - 0.05 * i + 0.01 * seed + (spike if i < 5 else 0.0) for i in range(40)]


def test_the_early_loss_is_the_mean_over_the_first_iterations_paired_with_the_reference(tmp_path):
    out_dir = tmp_path / 'out'
    spikes = dict(A=0.0, B=[0.8, 0.5, 0.9], R=[0.2, 0.1, 0.0])
    for variant in spikes:
        for k, seed in enumerate((0, 1, 2)):
            spike = spikes[variant] if variant == 'A' else spikes[variant][k]
            write_cell(str(out_dir), variant, 1e-3, seed, 0.1, 0.05, early_curve(seed, spike))
    # a run whose log stops before iteration 100 (a crash) has no early loss
    write_cell(str(out_dir), 'R', 1e-3, 3, None, None, early_curve(3, 0.0)[:9])
    path = tmp_path / 's.py'
    path.write_text(f"reference = 'A'\nseeds = [0, 1, 2, 3]\nlrs = [1e-3]\nearly_loss = 100\n"
                    f"cfg_options = {{'train_cfg.max_epochs': 1}}\n"
                    f"variants = dict(A=dict(config={BASELINE!r}), B=dict(config={CONDITIONED!r}),\n"
                    f"                R=dict(config={CONDITIONED!r}, reference='B'))\n")
    record_fingerprints(path, out_dir)
    run_runner(str(path), '--out-dir', str(out_dir), '--gather-only')  # R's seed 3 is missing: exit 1
    summary = json.loads((out_dir / 'suite.json').read_text())
    best = {entry['variant']: entry for entry in summary['best']}
    iters = np.arange(10, 410, 10)

    def by_hand(variant, seed):
        spike = spikes[variant] if variant == 'A' else spikes[variant][seed]
        return np.mean(np.asarray(early_curve(seed, spike))[iters <= 100])  # the first 10 logged losses

    for variant in spikes:
        assert best[variant]['early_loss']['values'] == pytest.approx([by_hand(variant, s) for s in (0, 1, 2)])
    assert best['A']['early_loss_difference'] is None
    for variant, reference in (('B', 'A'), ('R', 'B')):
        differences = [by_hand(variant, s) - by_hand(reference, s) for s in (0, 1, 2)]
        difference = best[variant]['early_loss_difference']
        half = stats.t.ppf(0.975, 2) * np.std(differences, ddof=1) / np.sqrt(3)
        assert (difference['mean'], difference['low'], difference['high']) == pytest.approx(
            (np.mean(differences), np.mean(differences) - half, np.mean(differences) + half))
        assert difference['per_seed'] == pytest.approx(differences)
        assert difference['p'] == pytest.approx(scipy_sign_flip(differences))
    b = best['B']['early_loss_difference']
    assert (f'| B | 0.001 | {best["B"]["early_loss"]["mean"]:.3f} ± {best["B"]["early_loss"]["std"]:.3f} '
            f'(' + ' / '.join(f'{by_hand("B", s):.3f}' for s in (0, 1, 2)) + f') | {b["mean"]:+.3f} [{b["low"]:+.3f}, '
            f'{b["high"]:+.3f}]') in (out_dir / 'suite.md').read_text()
    assert 'Mean training loss over iterations 1–100' in (out_dir / 'suite.md').read_text()
    path.write_text(path.read_text().replace('early_loss = 100', 'early_loss = 0'))
    with pytest.raises(SuiteError, match=r'early_loss is the number of first iterations .* got 0'):
        load_suite(str(path), REPO_ROOT)
