"""The NEON tree-crown study's rule (RULES['neon_trees_swin'] of condtok_mm/suites/confirmatory.py, and
tools/analysis/confirmatory_answer.py --suite neon_trees_swin) on written records of configs/suites/neon_trees_swin.py:
its numbers and words are its header's and its gate epochs validations its configs run, each reading is reached with
its words, no early-budget comparison is labelled or drawn, a reported cell whose loss diverged and that the test
could not score counts as test AP 0 with its arm not converged (from the run's out dir and its saved records alike;
one whose test never ended does not), and the tool answers a suite by name (an unknown one refused)."""
import dataclasses
import functools
import glob
import json
import os.path as osp

import numpy as np
import pytest

from condtok_mm.analysis import confirmatory_answer
from condtok_mm.suites import save_suite_records
from condtok_mm.suites.confirmatory import INCOMPLETE, RULES, answer
from condtok_mm.suites.plan import resolved_config
from condtok_mm.suites.report import fmt_difference
from condtok_mm.suites.schema import load_suite
from helpers import confirmatory_records
from helpers.confirmatory_records import (A, B, D, UNTESTABLE_LOG, as_read, final_checkpoint, sign_flip_p,
                                          t_interval)
from helpers.repo import REPO_ROOT
from helpers.suite_stages import validated_epochs

NEON = osp.join(REPO_ROOT, 'configs', 'suites', 'neon_trees_swin.py')
RULE = RULES['neon_trees_swin']
SEEDS = list(range(2, 10))
EPOCHS = tuple(range(20, 401, 20))
# per-seed differences (AP points), seeds 2-9
AHEAD = [3.1, 2.4, 4.0, 1.2, 3.3, 2.8, 5.0, 0.9]  # interval (1.7, 4.0), p 2/256
WELL_AHEAD = [10.1, 9.4, 11.0, 8.2, 10.3, 9.8, 12.0, 7.9]  # lo > 0 even with one baseline cell at AP 0
NULL_NARROW = [0.3, -0.4, 0.5, -0.2, 0.1, -0.3, 0.4, 0.0]  # interval (-0.23, 0.33)
BEHIND = [-2.1, -1.4, -3.0, -0.8, -2.5, -1.9, -2.2, -1.1]  # interval (-2.5, -1.3)
NULL_WIDE = [6.03141, -5.51259, 4.87326, -6.12453, 5.24681, -4.96172, 6.35718, -5.08294]  # (-4.9, 5.1), p 0.91
# per-seed changes of validation AP from epoch 360 to 400
FLAT = [0.2, -0.3, 0.1, 0.4, -0.2, 0.0, 0.3, -0.1]  # settled, not rising
RISING = [1.6, 2.1, 1.2, 1.9, 1.4, 2.3, 1.7, 1.5]  # mean 1.7, low 1.4: neither
SLOW_RISE = [0.8, 0.9, 0.7, 0.85, 0.75, 0.9, 0.8, 0.7]  # mean 0.8 < 1, low 0.73 > 0.5
AHEAD_TEXT = f'{B} ahead at the end of the schedule, the baseline not settled: not resolved'
NO_TEST = 'no test result (not run, or not finished)'


# the study's records (helpers.confirmatory_records.write_study) with its validations and gate, and their answer
write_study = functools.partial(confirmatory_records.write_study, epochs=EPOCHS, gate_epochs=RULE.gate_epochs)
answer_of = functools.partial(confirmatory_records.answer_of, rule=RULE)
flat_changes = functools.partial(confirmatory_records.arm_changes, FLAT)


@pytest.fixture(scope='module')
def suite():
    return load_suite(NEON, REPO_ROOT)


def test_the_rules_numbers_and_words_are_those_the_neon_header_declares(suite):
    with open(NEON) as f:
        header = ' '.join(word for line in f if line.startswith('#') for word in line.lstrip('#').split())
    first, last = RULE.gate_epochs
    margin = f'{RULE.margin_ap:g}'
    for declared in (f'validations at epochs {first} and {last}', f'AP({last}) - AP({first})',
                     f'the mean is below {RULE.converged_below_ap:g} AP in size',
                     f"the interval's low end is above {RULE.rising_above_ap:g} AP",
                     f'1. "{RULE.better_text}": lo > 0 and p <= {RULE.alpha:g}, and A settled and not rising;',
                     f'2. "{RULE.ahead_text.format(arm="B", epoch=last)}": lo > 0 and p <= {RULE.alpha:g};',
                     f'3. "{RULE.not_better_text.format(margin=margin)}": hi < {margin}, and A and B both settled '
                     'and not rising ("the baseline ends ahead" where hi < 0);',
                     'where that test cannot run on a diverged checkpoint the cell counts as test AP 0 and its arm '
                     'as not converged'):
        assert declared in header, declared
    assert RULE.untestable_diverged_as_zero
    # no early-budget comparison is declared, and none is labelled
    assert RULE.early_epoch is None and 'early budget' not in header and 'early-budget' not in header
    assert osp.join(REPO_ROOT, RULE.suite) == NEON
    assert (suite.reference, suite.family, suite.metric) == (RULE.reference, list(RULE.family), RULE.metric)
    assert f'confirmatory_answer.py RECORD_DIR --suite {osp.splitext(osp.basename(NEON))[0]}' in header


def test_the_gate_epochs_are_validations_every_neon_arm_runs_across_the_second_rate_cut(suite):
    for name, variant in suite.variants.items():
        cfg = resolved_config(variant.config_path, [*suite.options, *variant.options])
        first, last = RULE.gate_epochs
        assert validated_epochs(cfg.train_cfg) == list(EPOCHS), name  # what the synthetic records validate at
        assert last == cfg.train_cfg.max_epochs, name
        cuts = cfg.param_scheduler[1]['milestones']
        assert cuts[0] < first < cuts[1] < last, name


@pytest.mark.parametrize('b_minus_a, changes, number, text', [
    (AHEAD, flat_changes(), 1, 'a better detector on the held-out image'),
    (AHEAD, flat_changes(a=RISING), 2, AHEAD_TEXT),
    (AHEAD, flat_changes(a=SLOW_RISE), 2, AHEAD_TEXT),
    (NULL_NARROW, flat_changes(), 3, 'not a better detector by 2 AP or more'),
    (BEHIND, flat_changes(), 3, 'not a better detector by 2 AP or more (the baseline ends ahead)'),
    (NULL_NARROW, flat_changes(b=SLOW_RISE), 4, 'not resolved'),
], ids=['better', 'ahead-baseline-rising', 'ahead-baseline-settled-but-rising', 'not-better', 'baseline-ahead',
        'arm-rising'])
def test_each_neon_reading_is_reached_with_its_words(suite, tmp_path, b_minus_a, changes, number, text):
    test, _ = write_study(suite, tmp_path, b_minus_a, NULL_WIDE, changes)
    result = answer_of(suite, tmp_path)
    assert result['complete'] and result['finished'] == result['expected'] == 24 and result['missing'] == []
    assert result['readings'][B] == dict(number=number, text=text)
    assert result['readings'][D] == dict(number=4, text='not resolved')
    d = [as_read(test[B][s]) - as_read(test[A][s]) for s in SEEDS]
    primary = result['comparisons'][0]['difference']
    assert primary['seeds'] == SEEDS and primary['mean'] == pytest.approx(np.mean(d), abs=1e-12)
    assert (primary['low'], primary['high']) == pytest.approx(t_interval(d), abs=1e-9)
    assert primary['p'] == pytest.approx(sign_flip_p(d), abs=1e-12)
    gaps = result['validation_gaps']
    assert sorted({gap['epoch'] for gap in gaps}) == list(EPOCHS) and not any(gap['early_budget'] for gap in gaps)


def test_a_diverged_cell_the_test_could_not_score_counts_as_ap_0_and_its_arm_as_not_converged(suite, tmp_path):
    test, validation = write_study(suite, tmp_path / 'tested', WELL_AHEAD, NULL_WIDE, flat_changes())
    assert answer_of(suite, tmp_path / 'tested')['readings'][B]['number'] == 1
    write_study(suite, tmp_path / 'diverged', WELL_AHEAD, NULL_WIDE, flat_changes(), diverged=[(A, 5)])
    result = answer_of(suite, tmp_path / 'diverged')
    assert result['complete'] and result['missing'] == [] and result['finished'] == 24
    arm = result['arms'][A]
    assert arm['counted_as_zero'] == [5] and arm['diverged'] == []
    assert arm['test']['seeds'] == SEEDS and arm['test']['values'][SEEDS.index(5)] == 0.0
    d = [as_read(test[B][s]) - (0.0 if s == 5 else as_read(test[A][s])) for s in SEEDS]
    primary = result['comparisons'][0]['difference']
    assert primary['per_seed'] == pytest.approx(d, abs=1e-12)
    assert (primary['low'], primary['high']) == pytest.approx(t_interval(d), abs=1e-9) and primary['low'] > 0
    # its validations say settled; the diverged cell says not converged, so B ahead is not "a better detector"
    change = [as_read(validation[A][s][400]) - as_read(validation[A][s][360]) for s in SEEDS]
    gate = arm['gate']
    assert gate['mean'] == pytest.approx(np.mean(change), abs=1e-12) and abs(gate['mean']) < 1 and gate['complete']
    assert not gate['converged'] and not gate['rising']
    assert result['arms'][B]['gate']['converged'] and result['arms'][B]['counted_as_zero'] == []
    assert result['readings'][B] == dict(number=2, text=AHEAD_TEXT)
    # a rule without the clause leaves it missing, as any cell without a test result
    plain = answer_of(suite, tmp_path / 'diverged', rule=dataclasses.replace(RULE, untestable_diverged_as_zero=False))
    assert [(m['variant'], m['seed'], m['why']) for m in plain['missing']] == [(A, 5, NO_TEST)]
    assert plain['readings'][B] == dict(number=None, text=INCOMPLETE) and plain['arms'][A]['counted_as_zero'] == []
    # its training ended (the final checkpoint is there) but no test of it ended (stopped before or during the
    # test, whose --resume tests it): not counted, it is missing
    write_study(suite, tmp_path / 'untested', WELL_AHEAD, NULL_WIDE, flat_changes(), diverged=[(A, 5)],
                untested=[(A, 5)])
    assert osp.isfile(final_checkpoint(tmp_path / 'untested', A, 1e-3, 5, EPOCHS[-1]))
    unfinished = answer_of(suite, tmp_path / 'untested')
    assert [(m['variant'], m['seed'], m['why']) for m in unfinished['missing']] == [(A, 5, NO_TEST)]
    assert not unfinished['complete'] and unfinished['arms'][A]['counted_as_zero'] == []


def test_a_diverged_cell_the_test_could_not_score_counts_as_ap_0_from_its_saved_records(suite, tmp_path):
    """The study's answer is read from its saved records, which keep no checkpoint: the record of the test that
    ended on the final checkpoint is the evidence, and the records answer as the run's out dir does."""
    out_dir, record_dir = tmp_path / 'out', tmp_path / 'records'
    write_study(suite, out_dir, WELL_AHEAD, NULL_WIDE, flat_changes(), diverged=[(A, 5)])
    cells = save_suite_records.save_records(str(out_dir), str(record_dir))
    cell = record_dir / A / 'lr0.001' / 'seed5'
    assert osp.relpath(cell, record_dir) in cells and not glob.glob(str(record_dir / '**' / '*.pth'), recursive=True)
    assert (cell / 'test.log').read_text() == UNTESTABLE_LOG
    saved = answer_of(suite, record_dir)
    assert saved == answer_of(suite, out_dir)
    assert saved['complete'] and saved['finished'] == 24 and saved['arms'][A]['counted_as_zero'] == [5]
    assert saved['arms'][A]['test']['values'][SEEDS.index(5)] == 0.0 and not saved['arms'][A]['gate']['converged']
    assert saved['readings'][B] == dict(number=2, text=AHEAD_TEXT)
    # a rule without the clause (the demo study's) leaves it missing, from the records as from the run
    plain = answer_of(suite, record_dir, rule=dataclasses.replace(RULE, untestable_diverged_as_zero=False))
    assert [(m['variant'], m['seed'], m['why']) for m in plain['missing']] == [(A, 5, NO_TEST)]
    assert plain['readings'][B] == dict(number=None, text=INCOMPLETE)


def test_a_diverged_cell_whose_test_never_ended_is_not_saved_and_stays_missing(suite, tmp_path):
    """Stopped between its training and its test (or during the test): --resume tests it in the run's out dir, so
    the records neither keep it nor count it."""
    out_dir, record_dir = tmp_path / 'out', tmp_path / 'records'
    write_study(suite, out_dir, WELL_AHEAD, NULL_WIDE, flat_changes(), diverged=[(A, 5)], untested=[(A, 5)])
    cells = save_suite_records.save_records(str(out_dir), str(record_dir))
    assert osp.join(A, 'lr0.001', 'seed5') not in cells and len(cells) == 18 + 23
    result = answer_of(suite, record_dir)
    assert [(m['variant'], m['seed'], m['why']) for m in result['missing']] == [(A, 5, NO_TEST)]
    assert not result['complete'] and result['arms'][A]['counted_as_zero'] == []
    assert result['readings'][B] == dict(number=None, text=INCOMPLETE)


def test_a_cell_whose_test_ended_without_a_result_and_whose_loss_stayed_finite_is_missing_and_not_saved(suite,
                                                                                                       tmp_path):
    """A failed cell, not a diverged one: the rule runs it again (--resume), so nothing counts it."""
    out_dir, record_dir = tmp_path / 'out', tmp_path / 'records'
    write_study(suite, out_dir, WELL_AHEAD, NULL_WIDE, flat_changes(), untested=[(A, 5)])
    confirmatory_records.write_record(suite, out_dir, A, 1e-3, 5)  # the SHA-256 of the checkpoint a test ended on
    cells = save_suite_records.save_records(str(out_dir), str(record_dir))
    assert osp.join(A, 'lr0.001', 'seed5') not in cells and len(cells) == 18 + 23
    for root in (out_dir, record_dir):
        result = answer_of(suite, root)
        assert [(m['variant'], m['seed'], m['why']) for m in result['missing']] == [(A, 5, NO_TEST)]
        assert result['arms'][A]['counted_as_zero'] == [] and not result['complete']


def test_the_tool_answers_the_neon_suite_by_name_with_its_words_and_no_early_budget(suite, tmp_path, capsys,
                                                                                   monkeypatch):
    write_study(suite, tmp_path / 'records', WELL_AHEAD, NULL_WIDE, flat_changes(), diverged=[(A, 5)])
    figures, save = [], confirmatory_answer.save

    def keep(fig, path, **options):  # the figure, to read what the panel draws
        figures.append(fig)
        save(fig, path, **options)

    monkeypatch.setattr(confirmatory_answer, 'save', keep)
    confirmatory_answer.main([str(tmp_path / 'records'), '--suite', 'neon_trees_swin', '--out-dir',
                              str(tmp_path / 'out')])
    printed = capsys.readouterr().out
    assert printed.startswith('# The answer of configs/suites/neon_trees_swin.py\n')
    assert f'- {B} − {A} (primary): reading 2, **{AHEAD_TEXT}**' in printed
    assert f'- {D} − {A} (secondary): reading 4, **not resolved**' in printed
    assert '## Convergence gate: validation bbox AP(400) − AP(360) per arm' in printed
    assert f'| {A} | 2, 3, 4, 5, 6, 7, 8, 9 |' in printed and 'no (diverged, counted as test AP 0: 5)' in printed
    assert 'counts as test AP 0, and its arm as not converged.' in printed
    assert 'early-budget' not in printed and 'confirmatory' not in printed and 'demo_confirm_swin' not in printed
    assert (tmp_path / 'out' / 'answer.md').read_text() == printed.split('wrote ')[0].rstrip('\n') + '\n'
    saved = json.loads((tmp_path / 'out' / 'answer.json').read_text())
    assert saved['rule']['suite'] == RULE.suite and saved['readings'][B]['number'] == 2
    assert saved['arms'][A]['counted_as_zero'] == [5]
    assert (tmp_path / 'out' / 'answer.png').read_bytes()[:4] == b'\x89PNG'
    # the validation panel marks the gate (dashed) and no early budget (dotted)
    curves = figures[0].axes[1]
    marks = {line.get_linestyle(): [] for line in curves.lines}
    for line in curves.lines:
        xs = list(line.get_xdata())
        if len(xs) == 2 and xs[0] == xs[1]:
            marks[line.get_linestyle()].append(xs[0])
    assert marks.get('--') == list(RULE.gate_epochs) and not marks.get(':')
    assert 'early' not in curves.get_xlabel()


def test_the_described_test_metrics_are_each_arms_values_and_their_paired_differences_uncorrected(suite, tmp_path,
                                                                                                  capsys):
    """The header describes the test AP50 and small-crown AP beside the endpoint: per arm and paired by seed as the
    endpoint is, without Holm's adjustment, a cell counted as test AP 0 counting 0 there too."""
    header = ' '.join(line.lstrip('#').strip() for line in open(NEON) if line.startswith('#'))
    assert [key for key, _ in RULE.described_metrics] == ['coco/bbox_mAP_50', 'coco/bbox_mAP_s']
    assert 'the test AP50 and small-crown AP (coco/bbox_mAP_s' in header
    write_study(suite, tmp_path, WELL_AHEAD, NULL_WIDE, flat_changes(), diverged=[(A, 5)])
    rng = np.random.default_rng(0)
    written = {}
    for path in glob.glob(str(tmp_path / '*' / 'lr*' / 'seed*' / 'test' / '*' / '*.json')):
        arm, seed = path.split(osp.sep)[-6], int(path.split(osp.sep)[-4][len('seed'):])
        with open(path) as f:
            metrics = json.load(f)
        metrics['coco/bbox_mAP_50'], metrics['coco/bbox_mAP_s'] = (round(float(v), 3) for v in rng.uniform(0, 0.6, 2))
        with open(path, 'w') as f:
            json.dump(metrics, f)
        written[arm, seed] = metrics
    result = answer_of(suite, tmp_path)
    described = {entry['metric']: entry for entry in result['described']}
    assert list(described) == ['coco/bbox_mAP_50', 'coco/bbox_mAP_s']
    for key, entry in described.items():
        values = {arm: [0.0 if (arm, s) == (A, 5) else 100 * written[arm, s][key] for s in SEEDS] for arm in (A, B, D)}
        for arm in (A, B, D):
            assert entry['arms'][arm]['seeds'] == SEEDS
            assert entry['arms'][arm]['values'] == pytest.approx(values[arm], abs=1e-12)
        pairs = [(c['arm'], c['reference']) for c in entry['comparisons']]
        assert pairs == [(B, A), (D, A), (D, B)] and all(c['p_holm'] is None for c in entry['comparisons'])
        for comparison in entry['comparisons']:
            d = np.subtract(values[comparison['arm']], values[comparison['reference']])
            difference = comparison['difference']
            assert difference['per_seed'] == pytest.approx(d, abs=1e-12)
            assert (difference['low'], difference['high']) == pytest.approx(t_interval(d), abs=1e-9)
            assert difference['p'] == pytest.approx(sign_flip_p(d), abs=1e-12)
    confirmatory_answer.main([str(tmp_path), '--suite', 'neon_trees_swin', '--out-dir', str(tmp_path / 'out')])
    printed = capsys.readouterr().out
    small = 'small-crown AP (under 32² px)'
    assert (f'## Test {small} on the reported seeds, held-out split (described, uncorrected, deciding nothing)'
            in printed)
    difference = described['coco/bbox_mAP_s']['comparisons'][2]['difference']
    assert f'| {D} − {B} | {fmt_difference(difference)} |' in printed
    # the shapes study's rule describes none
    assert RULES['demo_confirm_swin'].described_metrics == ()


def test_the_tool_refuses_a_suite_without_a_declared_rule_naming_those_with_one(tmp_path, capsys):
    with pytest.raises(SystemExit) as stopped:
        confirmatory_answer.main([str(tmp_path), '--suite', 'neon_trees'])
    assert stopped.value.code == 2
    error = capsys.readouterr().err
    assert "--suite 'neon_trees' has no declared rule" in error and 'demo_confirm_swin, neon_trees_swin' in error
    assert not (tmp_path / 'answer.md').exists()


def test_a_rule_answers_its_own_suite_file_only(suite):
    with pytest.raises(ValueError, match='neon_trees_swin.py, not configs/suites/demo_confirm_swin.py'):
        answer(suite, [], RULES['demo_confirm_swin'])
