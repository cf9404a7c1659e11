"""The confirmatory study's rule (condtok_mm/suites/confirmatory.py, tools/analysis/confirmatory_answer.py) on
written records of configs/suites/demo_confirm_swin.py: each reading is reached when, and only when, its condition
holds (at the boundaries too), the numbers against numpy/scipy and Holm by hand, the incomplete answer names the
missing cells (a diverged cell without a test among them: this header counts none as AP 0), the seeds whose arms
ran on different CPU kinds are left out of the description only, and each arm's rate is the runner's choice (at the
grid's edge where it is)."""
import dataclasses
import functools
import json
import os.path as osp

import numpy as np
import pytest

from condtok_mm.analysis import confirmatory_answer
from condtok_mm.suites import save_suite_records
from condtok_mm.suites.confirmatory import INCOMPLETE, RULES, ConfirmatoryRule, answer, convergence_gate, reading
from condtok_mm.suites.schema import load_suite
from helpers import confirmatory_records
from helpers.confirmatory_records import A, B, CPU, D, as_read, selection_ap, sign_flip_p, t_interval
from helpers.repo import REPO_ROOT

CONFIRM = osp.join(REPO_ROOT, 'configs', 'suites', 'demo_confirm_swin.py')
SEEDS = list(range(9, 21))
EPOCHS = (6, 12, 18, 24, 30, 33, 36)
RULE = ConfirmatoryRule()
# per-seed differences (AP points), seeds 9-20. In the ones whose p is checked no sign pattern ties the observed
# |sum| in exact arithmetic but its own negation, so that the p-value does not hang on float rounding.
AHEAD = [3.1, 2.4, 4.0, 1.2, 3.3, 2.8, 5.0, 0.9, 2.2, 3.6, 1.7, 4.4]  # interval (2.1, 3.7), p 2/4096
NULL_NARROW = [0.3, -0.4, 0.5, -0.2, 0.1, -0.3, 0.4, 0.0, -0.1, 0.2, -0.5, 0.3]  # interval (-0.18, 0.23)
BEHIND = [-2.1, -1.4, -3.0, -0.8, -2.5, -1.9, -2.2, -1.1, -2.7, -1.6, -2.0, -1.3]  # interval (-2.3, -1.5)
NULL_WIDE = [6.03141, -5.51259, 4.87326, -6.12453, 5.24681, -4.96172, 6.35718, -5.08294, 5.59437, -6.27815,
             4.71923, -5.86711]  # interval (-3.8, 3.6), p 0.92
HOLM_EDGE = [3.03, 2.51, -1.07, 4.02, 1.53, -2.09, 3.57, 2.04, -0.55, 2.86, 1.01, 0.63]  # (0.23, 2.7), p 0.029
# per-seed changes of validation AP from epoch 33 to 36
FLAT = [0.2, -0.3, 0.1, 0.4, -0.2, 0.0, 0.3, -0.1, 0.2, -0.4, 0.1, 0.0]  # converged, not rising
RISING = [1.6, 2.1, 1.2, 1.9, 1.4, 2.3, 1.7, 1.5, 2.0, 1.1, 1.8, 1.6]  # mean 1.7, low 1.5: neither
SLOW_RISE = [0.8, 0.9, 0.7, 0.85, 0.75, 0.9, 0.8, 0.7, 0.95, 0.8, 0.85, 0.75]  # mean 0.81 < 1, low 0.76 > 0.5


# the study's records (helpers.confirmatory_records.write_study) with its validations and gate, and their answer
write_study = functools.partial(confirmatory_records.write_study, epochs=EPOCHS, gate_epochs=RULE.gate_epochs)
answer_of = functools.partial(confirmatory_records.answer_of, rule=RULE)
flat_changes = functools.partial(confirmatory_records.arm_changes, FLAT)


@pytest.fixture(scope='module')
def suite():
    return load_suite(CONFIRM, REPO_ROOT)


def test_a_better_final_detector_with_every_number_against_numpy_scipy_and_holm_by_hand(suite, tmp_path):
    test, validation = write_study(suite, tmp_path, AHEAD, NULL_WIDE, flat_changes())
    result = answer_of(suite, tmp_path)
    assert result['complete'] and result['finished'] == result['expected'] == 36 and result['missing'] == []
    assert result['readings'][B] == dict(number=1, text='a better final detector')
    assert result['readings'][D] == dict(number=4, text='not resolved')
    comparisons = {(c['arm'], c['reference']): c for c in result['comparisons']}
    raw = {}
    for arm, reference in ((B, A), (D, A), (D, B)):
        d = [as_read(test[arm][s]) - as_read(test[reference][s]) for s in SEEDS]
        found = comparisons[arm, reference]
        assert found['difference']['mean'] == pytest.approx(np.mean(d), abs=1e-12)
        assert (found['difference']['low'], found['difference']['high']) == pytest.approx(t_interval(d), abs=1e-9)
        assert found['difference']['p'] == pytest.approx(sign_flip_p(d), abs=1e-12)
        assert found['difference']['per_seed'] == pytest.approx(d, abs=1e-12)
        raw[arm, reference] = sign_flip_p(d)
    # Holm over {B - A, D - A} by hand: p(B - A) = 2/4096 is the smaller, times 2; p(D - A) times 1, not below it
    p_b, p_d = raw[B, A], raw[D, A]
    assert p_b == 2 / 4096 and p_d > 0.9
    assert comparisons[B, A]['p_holm'] == pytest.approx(2 * p_b)
    assert comparisons[D, A]['p_holm'] == pytest.approx(max(2 * p_b, p_d))
    assert comparisons[D, B]['p_holm'] is None and not comparisons[D, B]['in_family']
    for arm in (A, B, D):
        change = [as_read(validation[arm][s][36]) - as_read(validation[arm][s][33]) for s in SEEDS]
        gate = result['arms'][arm]['gate']
        assert gate['mean'] == pytest.approx(np.mean(change), abs=1e-12)
        assert (gate['low'], gate['high']) == pytest.approx(t_interval(change), abs=1e-9)
        assert gate['converged'] and not gate['rising']
    gaps = {(gap['arm'], gap['epoch']): gap for gap in result['validation_gaps']}
    assert sorted({epoch for _, epoch in gaps}) == list(EPOCHS)
    assert [epoch for (arm, epoch), gap in gaps.items() if gap['early_budget']] == [12, 12]
    for arm in (B, D):
        d = [as_read(validation[arm][s][12]) - as_read(validation[A][s][12]) for s in SEEDS]
        assert gaps[arm, 12]['difference']['mean'] == pytest.approx(np.mean(d), abs=1e-12)
        assert (gaps[arm, 12]['difference']['low'], gaps[arm, 12]['difference']['high']) == pytest.approx(
            t_interval(d), abs=1e-9)
    assert {arm: result['rates'][arm]['lr'] for arm in (A, B, D)} == {A: 1e-3, B: 1e-3, D: 1e-3}
    assert result['machines']['mixed_seeds'] == [] and result['machines']['primary_without_mixed'] is None


def test_the_tool_prints_and_writes_the_answer_its_json_and_figure(suite, tmp_path, capsys):
    write_study(suite, tmp_path / 'records', AHEAD, NULL_WIDE, flat_changes())
    confirmatory_answer.main([str(tmp_path / 'records'), '--out-dir', str(tmp_path / 'out')])
    printed = capsys.readouterr().out
    assert f'{B} − {A} (primary): reading 1, **a better final detector**' in printed
    assert f'{D} − {A} (secondary): reading 4, **not resolved**' in printed
    assert '| 12 (the early-budget comparison) |' in printed
    assert 'outside the family, uncorrected: supports no claim' in printed
    assert 'Incomplete' not in printed
    assert (tmp_path / 'out' / 'answer.md').read_text() == printed.split('wrote ')[0].rstrip('\n') + '\n'
    saved = json.loads((tmp_path / 'out' / 'answer.json').read_text())
    assert saved['readings'][B]['number'] == 1 and saved['finished'] == 36
    assert (tmp_path / 'out' / 'answer.png').read_bytes()[:4] == b'\x89PNG'


@pytest.mark.parametrize('baseline', [RISING, SLOW_RISE], ids=['rising-not-converged', 'converged-but-rising'])
def test_b_ahead_with_the_baseline_still_rising_is_not_resolved(suite, tmp_path, baseline):
    write_study(suite, tmp_path, AHEAD, NULL_WIDE, flat_changes(a=baseline))
    result = answer_of(suite, tmp_path)
    gate = result['arms'][A]['gate']
    assert gate['rising']  # the interval's low end is above 0.5 AP: rising, whatever |mean| < 1 says
    assert gate['converged'] == (baseline is SLOW_RISE)
    assert result['readings'][B] == dict(
        number=2, text=f'{B} ahead at 36 epochs, the baseline still rising: the final detector not resolved')


@pytest.mark.parametrize('b_minus_a, wording', [
    (NULL_NARROW, 'not a better final detector by 2 AP or more'),
    (BEHIND, 'not a better final detector by 2 AP or more (the baseline ends ahead)')])
def test_not_better_by_two_ap_needs_both_arms_settled_and_says_where_the_baseline_ends_ahead(suite, tmp_path,
                                                                                             b_minus_a, wording):
    write_study(suite, tmp_path / 'settled', b_minus_a, NULL_WIDE, flat_changes())
    assert answer_of(suite, tmp_path / 'settled')['readings'][B] == dict(number=3, text=wording)
    for name, changes in (('b_rising', flat_changes(b=SLOW_RISE)), ('a_rising', flat_changes(a=RISING))):
        write_study(suite, tmp_path / name, b_minus_a, NULL_WIDE, changes)
        assert answer_of(suite, tmp_path / name)['readings'][B] == dict(number=4, text='not resolved'), name


def test_the_readings_use_the_holm_adjusted_p_not_the_raw_one(suite, tmp_path):
    test, _ = write_study(suite, tmp_path, HOLM_EDGE, NULL_WIDE, flat_changes())
    result = answer_of(suite, tmp_path)
    d = [as_read(test[B][s]) - as_read(test[A][s]) for s in SEEDS]
    low, high = t_interval(d)
    # lo > 0 and a raw p at most 0.05 would read 1; Holm doubles the smaller p of the family past 0.05
    assert low > 0 and sign_flip_p(d) <= 0.05 < 2 * sign_flip_p(d) and high >= 2
    primary = result['comparisons'][0]
    assert primary['p_holm'] == pytest.approx(2 * sign_flip_p(d))
    assert result['readings'][B] == dict(number=4, text='not resolved')


def settled_gate():
    return dict(converged=True, rising=False)


@pytest.mark.parametrize('low, high, p, expected', [
    (1e-9, 5.0, 0.01, 1), (0.0, 5.0, 0.01, 4),  # lo must be above 0
    (0.5, 5.0, 0.05, 1), (0.5, 5.0, 0.05 + 1e-12, 4),  # p at most 0.05
    (-1.0, 2.0 - 1e-9, 0.5, 3), (-1.0, 2.0, 0.5, 4),  # hi below 2
    (-3.0, -1e-9, 0.001, 3), (-3.0, 0.0, 0.001, 3)])  # the baseline ends ahead: hi < 0 (wording below)
def test_each_reading_at_its_boundaries(low, high, p, expected):
    difference = dict(mean=(low + high) / 2, low=low, high=high)
    found = reading(B, difference, p, settled_gate(), settled_gate(), RULE)
    assert found['number'] == expected
    assert found['text'].endswith('(the baseline ends ahead)') == (expected == 3 and high < 0)


def test_a_reading_that_needs_a_gate_falls_through_without_one():
    ahead = dict(mean=3.0, low=1.0, high=5.0)
    assert reading(B, ahead, 0.01, None, settled_gate(), RULE)['number'] == 2
    assert reading(B, ahead, 0.01, dict(converged=True, rising=True), settled_gate(), RULE)['number'] == 2
    null = dict(mean=0.0, low=-1.0, high=1.0)
    assert reading(B, null, 0.9, settled_gate(), None, RULE)['number'] == 4
    assert reading(B, null, 0.9, settled_gate(), dict(converged=False, rising=False), RULE)['number'] == 4
    assert reading(B, null, 0.9, settled_gate(), settled_gate(), RULE)['number'] == 3
    assert reading(B, dict(mean=1.0, low=None, high=None), 0.5, settled_gate(), settled_gate(), RULE)['number'] == 4


def test_the_gate_at_its_boundaries_and_over_the_reported_seeds_only():
    def curve(changes, seeds=SEEDS):
        return {33: {s: 20.0 for s in seeds}, 36: {s: 20.0 + c for s, c in zip(seeds, changes)}}

    at_one = convergence_gate(curve([1.0] * 12), SEEDS, RULE)  # |mean| must be below 1
    assert at_one['mean'] == 1.0 and not at_one['converged']
    below_one = convergence_gate(curve([-1.0 + 2 ** -20] * 12), SEEDS, RULE)
    assert below_one['converged'] and not below_one['rising']
    at_half = convergence_gate(curve([0.5] * 12), SEEDS, RULE)  # rising: the low end above 0.5
    assert at_half['low'] == 0.5 and not at_half['rising'] and at_half['converged']
    above_half = convergence_gate(curve([0.5 + 2 ** -20] * 12), SEEDS, RULE)
    assert above_half['rising'] and above_half['converged']
    short = convergence_gate(curve([0.0] * 11, SEEDS[:11]), SEEDS, RULE)  # seed 20 never validated at 33/36
    assert short['n'] == 11 and not short['complete'] and not short['converged']
    extra = curve([0.0] * 12)
    extra[33][0], extra[36][0] = 20.0, 30.0  # a selection seed's change is not the gate's
    assert convergence_gate(extra, SEEDS, RULE)['seeds'] == SEEDS
    assert convergence_gate({}, SEEDS, RULE) is None


@pytest.mark.parametrize('changes', [[12, 5, 8, 20, 20, 20, 12, 5, 20, 8, 8, -18],
                                     [-20, -20, -15, 0, -20, -12, -8, -12, -5, -10, -8, 10]])
def test_a_gate_change_of_exactly_one_ap_is_not_below_one_where_float_rounding_puts_it_below(changes):
    # validation APs as CocoMetric rounds them (three decimals of a fraction; ``changes`` in its steps of 0.1 AP),
    # read in percent: the changes sum to +-12.0 AP over the twelve seeds, a mean of exactly 1 AP in size, which
    # float rounding of the per-seed differences puts a few ulps below 1
    before = dict(zip(SEEDS, [312, 287, 301, 295, 330, 276, 318, 289, 305, 322, 298, 310]))
    after = {seed: before[seed] + change for seed, change in zip(SEEDS, changes)}
    assert abs(sum(changes)) == 120
    def as_recorded(steps):  # the fraction CocoMetric logs (steps / 1000), read in percent
        return 100 * (steps / 1000)

    curve = {33: {s: as_recorded(v) for s, v in before.items()}, 36: {s: as_recorded(v) for s, v in after.items()}}
    gate = convergence_gate(curve, SEEDS, RULE)
    assert abs(gate['mean']) < 1  # in float
    assert not gate['converged']
    # one step less in one seed: 11.9 AP in all, below 1 AP in size
    curve[36][20] = as_recorded(after[20] - np.sign(sum(changes)))
    assert convergence_gate(curve, SEEDS, RULE)['converged']


def test_until_every_reported_cell_finished_the_answer_is_incomplete_naming_the_missing(suite, tmp_path, capsys):
    test, _ = write_study(suite, tmp_path, AHEAD, NULL_WIDE, flat_changes(), untested=[(B, 14)],
                          not_held_out=[(D, 17)])
    result = answer_of(suite, tmp_path)
    assert not result['complete'] and result['finished'] == 34
    assert [(m['variant'], m['lr'], m['seed']) for m in result['missing']] == [(B, 1e-3, 14), (D, 1e-3, 17)]
    assert result['missing'][0]['why'] == 'no test result (not run, or not finished)'
    assert 'does not record the held-out test split' in result['missing'][1]['why']
    assert result['readings'] == {B: dict(number=None, text=INCOMPLETE), D: dict(number=None, text=INCOMPLETE)}
    # what exists is still described: B - A on its 11 seeds
    d = [as_read(test[B][s]) - as_read(test[A][s]) for s in SEEDS if s != 14]
    assert result['comparisons'][0]['difference']['mean'] == pytest.approx(np.mean(d), abs=1e-12)
    assert result['comparisons'][0]['difference']['seeds'] == [s for s in SEEDS if s != 14]
    confirmatory_answer.main([str(tmp_path), '--out-dir', str(tmp_path / 'out')])
    printed = capsys.readouterr().out
    assert '**Incomplete: 34 of the 36 reported cells have finished; the answer is "not resolved (incomplete)"' in printed
    assert f'- {B} lr 0.001, seeds 14: no test result' in printed
    assert f'- {D} lr 0.001, seeds 17: its suite_cell.json does not record the held-out test split' in printed
    assert f'Test bbox AP on the reported seeds ({", ".join(map(str, SEEDS))}), held-out split (incomplete)' in printed


def test_seeds_whose_arms_ran_on_other_cpus_are_left_out_of_a_description_and_not_of_the_decision(suite, tmp_path):
    # a CPU not recorded shares no kind, not even with another not recorded
    cpus = {(B, 9): 'Intel Xeon (AVX2)', (A, 10): None, (B, 10): None, (D, 10): None}
    test, _ = write_study(suite, tmp_path, AHEAD, NULL_WIDE, flat_changes(), cpus=cpus)
    result = answer_of(suite, tmp_path)
    machines = result['machines']
    assert machines['mixed_seeds'] == [9, 10]
    assert machines['cpus'] == {CPU: 32, 'Intel Xeon (AVX2)': 1, 'not recorded': 3}
    assert machines['commits'] == {'8641aba33594': 36}
    kept = [s for s in SEEDS if s not in (9, 10)]
    d = [as_read(test[B][s]) - as_read(test[A][s]) for s in kept]
    without = machines['primary_without_mixed']
    assert without['seeds'] == kept and without['mean'] == pytest.approx(np.mean(d), abs=1e-12)
    assert (without['low'], without['high']) == pytest.approx(t_interval(d), abs=1e-9)
    assert without['p'] == pytest.approx(sign_flip_p(d))
    # the decision is on all twelve seeds
    assert result['comparisons'][0]['difference']['seeds'] == SEEDS and result['readings'][B]['number'] == 1
    cell = next(c for c in machines['cells'] if (c['variant'], c['seed']) == (B, 9))
    assert (cell['commit'], cell['cpu'], cell['lr']) == ('8641aba33594', 'Intel Xeon (AVX2)', 1e-3)


def test_each_arm_is_read_at_the_runners_choice_and_named_at_the_grids_edge(suite, tmp_path):
    write_study(suite, tmp_path / 'edges', AHEAD, NULL_WIDE, flat_changes(), best={A: 5e-4, B: 8e-3, D: 2e-3})
    rates = answer_of(suite, tmp_path / 'edges')['rates']
    assert {arm: (rates[arm]['lr'], rates[arm]['edge']) for arm in (A, B, D)} == {
        A: (5e-4, 'lowest'), B: (8e-3, 'extension'), D: (2e-3, None)}
    b_rates = {row['lr']: row for row in rates[B]['selection']}
    assert sorted(b_rates) == [5e-4, 1e-3, 2e-3, 4e-3, 8e-3]
    assert b_rates[8e-3]['metric']['values'] == pytest.approx([as_read(selection_ap(B, 8e-3, s, {B: 8e-3}))
                                                               for s in (0, 1)])
    # best at 4e-3 but its extension rate not run yet: no rate, and none of its reported cells is read
    write_study(suite, tmp_path / 'waiting', AHEAD, NULL_WIDE, flat_changes(), best={B: 4e-3},
                skip_selection=[(B, 8e-3, 0), (B, 8e-3, 1)])
    result = answer_of(suite, tmp_path / 'waiting')
    assert result['rates'][B]['lr'] is None and '2 of its 10 selection cells did not finish' in result['rates'][B][
        'waiting']
    assert [m['seed'] for m in result['missing'] if m['variant'] == B] == SEEDS
    assert result['finished'] == 24 and result['readings'][B]['text'] == INCOMPLETE


def test_a_tie_on_the_selection_seeds_goes_to_the_smaller_rate(suite, tmp_path):
    write_study(suite, tmp_path, AHEAD, NULL_WIDE, flat_changes(), best={D: 2e-3})
    # D's 2e-3 cells are its best; give its 1e-3 cells the same AP
    for seed in suite.selection_seeds:
        path = tmp_path / D / 'lr0.001' / f'seed{seed}' / 'test' / '20260101_000100' / '20260101_000100.json'
        record = json.loads(path.read_text())
        record['coco/bbox_mAP'] = selection_ap(D, 2e-3, seed, {D: 2e-3}) / 100
        path.write_text(json.dumps(record))
    assert answer_of(suite, tmp_path)['rates'][D]['lr'] == 1e-3


def test_the_rules_defaults_are_the_numbers_the_suites_header_declares(suite):
    with open(CONFIRM) as f:
        header = ' '.join(word for line in f if line.startswith('#') for word in line.lstrip('#').split())
    first, last = RULE.gate_epochs
    for declared in (f'bbox AP at epochs {first} and {last}', f'AP({last}) - AP({first})',
                     f'the mean is below {RULE.converged_below_ap:g} AP in size',
                     f"the interval's low end is above {RULE.rising_above_ap:g} AP",
                     f'lo > 0 and p <= {RULE.alpha:g}, and A converged and not rising',
                     f'"not a better final detector by {RULE.margin_ap:g} AP or more": hi < {RULE.margin_ap:g},',
                     f'with the epoch-{RULE.early_epoch} gap as the early-budget comparison'):
        assert declared in header, declared
    assert (suite.reference, suite.family, suite.metric) == (RULE.reference, list(RULE.family), RULE.metric)


def test_a_rule_that_is_not_the_suites_is_refused_naming_what_differs(suite):
    with pytest.raises(ValueError, match="family"):
        answer(suite, [], dataclasses.replace(RULE, family=(D, B)))
    with pytest.raises(ValueError, match='arms'):
        answer(suite, [], dataclasses.replace(RULE, family=(B, 'C_other')))


def test_the_registered_rule_of_this_suite_keeps_a_diverged_cell_without_a_test_missing(suite, tmp_path):
    # its header: a diverged cell keeps the AP its checkpoint's test gives, and says nothing of a test that cannot run
    assert RULES['demo_confirm_swin'] == RULE and RULE.suite == 'configs/suites/demo_confirm_swin.py'
    write_study(suite, tmp_path, AHEAD, NULL_WIDE, flat_changes(), diverged=[(B, 14)])
    result = answer_of(suite, tmp_path)
    assert [(m['variant'], m['lr'], m['seed'], m['why']) for m in result['missing']] == [
        (B, 1e-3, 14, 'no test result (not run, or not finished)')]
    assert not result['complete'] and result['finished'] == 35
    assert result['arms'][B]['counted_as_zero'] == [] and 14 not in result['arms'][B]['test']['seeds']
    assert result['readings'][B] == dict(number=None, text=INCOMPLETE)
    # the saved records keep the cell (its test ended without a result) and the answer from them is the same
    assert f'{B}/lr0.001/seed14' in save_suite_records.save_records(str(tmp_path), str(tmp_path / 'records'))
    assert answer_of(suite, tmp_path / 'records') == result
