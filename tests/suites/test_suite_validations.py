"""The validations during training of a gathered suite (the decisive study's secondary endpoint: AP at epochs 3
and 6) and what seeds.png draws, against hand computations on written cells (numpy, scipy)."""
import json

import numpy as np
import pytest
from scipy import stats

from condtok_mm.suites.plots import seed_lines, validation_curves
from helpers.suite_runs import BASELINE, CONDITIONED, record_fingerprints, run_runner, write_cell, write_suite

SEEDS = (3, 4, 5, 6)
# bbox AP (fraction) at epochs 3, 6 and the final test, by variant and seed; B's seed 6 missed its epoch-6
# validation, so that epoch pairs B with A on seeds 3-5 only
VALIDATIONS = {
    'A': {3: {3: 0.01, 6: 0.03}, 4: {3: 0.02, 6: 0.02}, 5: {3: 0.00, 6: 0.05}, 6: {3: 0.01, 6: 0.04}},
    'B': {3: {3: 0.05, 6: 0.09}, 4: {3: 0.03, 6: 0.10}, 5: {3: 0.04, 6: 0.06}, 6: {3: 0.08}},
}
FINAL = {'A': {3: 0.04, 4: 0.05, 5: 0.06, 6: 0.03}, 'B': {3: 0.12, 4: 0.08, 5: 0.10, 6: 0.11}}


def scipy_sign_flip(differences):
    return stats.permutation_test((np.asarray(differences),), np.mean, permutation_type='samples',
                                  alternative='two-sided', n_resamples=np.inf).pvalue


@pytest.fixture
def summary(tmp_path):
    out_dir = tmp_path / 'out'
    for variant, lr in (('A', 2.5e-4), ('B', 1e-3)):
        for seed in SEEDS:
            write_cell(str(out_dir), variant, lr, seed, FINAL[variant][seed], 0.01, [3.0, 2.0, 1.0],
                       validations=VALIDATIONS[variant][seed])
    suite = write_suite(tmp_path / 'suite.py', dict(A=dict(config=BASELINE, lrs=[2.5e-4]),
                                                    B=dict(config=CONDITIONED, lrs=[1e-3])),
                        seeds=SEEDS, lrs=(1e-3,), reference='A', cfg_options={'train_cfg.max_epochs': 1})
    record_fingerprints(suite, out_dir)
    result = run_runner(suite, '--out-dir', str(out_dir), '--gather-only')
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return json.loads((out_dir / 'suite.json').read_text()), (out_dir / 'suite.md').read_text()


def test_each_validated_epoch_has_the_per_seed_values_and_the_difference_paired_on_the_common_seeds(summary):
    summary, table = summary
    rows = {(row['variant'], row['epoch']): row for row in summary['validation']}
    assert sorted(rows) == [('A', 3), ('A', 6), ('B', 3), ('B', 6)]
    for (variant, epoch), row in rows.items():
        seeds = [seed for seed in SEEDS if epoch in VALIDATIONS[variant][seed]]
        values = [100 * VALIDATIONS[variant][seed][epoch] for seed in seeds]
        assert row['metric']['seeds'] == seeds and row['metric']['values'] == pytest.approx(values)
        assert row['metric']['mean'] == pytest.approx(np.mean(values))
        assert row['metric']['std'] == pytest.approx(np.std(values, ddof=1))
        if variant == 'A':
            assert row['difference'] is None
            continue
        differences = [100 * (VALIDATIONS['B'][s][epoch] - VALIDATIONS['A'][s][epoch]) for s in seeds]
        half = stats.t.ppf(0.975, len(seeds) - 1) * np.std(differences, ddof=1) / np.sqrt(len(seeds))
        difference = row['difference']
        assert difference['seeds'] == seeds
        assert (difference['mean'], difference['low'], difference['high']) == pytest.approx(
            (np.mean(differences), np.mean(differences) - half, np.mean(differences) + half))
        assert difference['p'] == pytest.approx(scipy_sign_flip(differences))
    assert rows['B', 6]['difference']['seeds'] == [3, 4, 5]
    b6 = [100 * VALIDATIONS['B'][s][6] for s in (3, 4, 5)]
    a6 = [100 * VALIDATIONS['A'][s][6] for s in (3, 4, 5)]
    d6 = [b - a for b, a in zip(b6, a6)]
    assert (f'| B | 0.001 | 6 | {np.mean(b6):.1f} ± {np.std(b6, ddof=1):.1f} ('
            + ' / '.join(f'{v:.1f}' for v in b6) + f') | {np.mean(d6):+.1f} [') in table


def test_the_seed_figure_joins_each_seed_across_the_variants_and_draws_the_validation_means(summary):
    summary, _ = summary
    assert seed_lines(summary['best'], 'coco/bbox_mAP') == {
        seed: [(0, pytest.approx(100 * FINAL['A'][seed])), (1, pytest.approx(100 * FINAL['B'][seed]))]
        for seed in SEEDS}
    curves = validation_curves(summary['validation'])
    for variant in ('A', 'B'):
        epochs, means, lows, highs = curves[variant]
        assert epochs == [3, 6]
        for epoch, mean, low, high in zip(epochs, means, lows, highs):
            values = [100 * VALIDATIONS[variant][s][epoch] for s in SEEDS if epoch in VALIDATIONS[variant][s]]
            assert (mean, low, high) == pytest.approx((np.mean(values), min(values), max(values)))
