"""tools/analysis/attention_kappa.py: κ of the tokens and of each attention layer per arm of a suite run, at the
start, middle and end of training, against numpy/scipy on written hook records (a resumed cell included), with
values above 2**24 (numerically singular in float32) shown as such and left out of the comparisons."""
import itertools
import json

import numpy as np
import pytest
from scipy import stats

from condtok_mm.analysis import attention_kappa

KEYS = ['kappa/tokens_in_mean/stage0', 'kappa/tokens_out_mean/stage0', 'kappa/attn_softmax_mean/layer00',
        'kappa/attn_softmax_mean/layer01', 'kappa/attn_out_mean/layer00', 'kappa/attn_out_mean/layer01']
STEPS = [1, 50, 100, 150, 200]
SEEDS = [3, 4, 5]
SINGULAR = 2.0 ** 24  # 1/u of float32: above it a float32 matrix is numerically singular


def kappa(arm, seed, key, step):
    """A distinct value per cell, quantity and iteration, spanning orders of magnitude."""
    return 10 ** (1 + KEYS.index(key) + 0.1 * seed ** (2 if arm == 'cond' else 1) + step / 100) * (
        3.0 if arm == 'cond' else 1.0)


def write_records(root):
    """A gathered suite of two arms (cond against base) whose cells' hook records hold ``kappa(arm, seed, key,
    step)``."""
    arms = [dict(variant='base', lr=1e-3, seeds=SEEDS, reference=None),
            dict(variant='cond', lr=2e-3, seeds=SEEDS, reference='base')]
    for arm in arms:
        for seed in SEEDS:
            cell = root / arm['variant'] / f'lr{arm["lr"]:g}' / f'seed{seed}'
            records = [{**{key: kappa(arm['variant'], seed, key, step) for key in KEYS}, 'step': step}
                       for step in STEPS]
            records += [dict(loss=1.0, iter=step, epoch=1, step=step) for step in STEPS]
            runs = [records] if seed != 4 else [  # seed 4: killed after 120 and resumed from 100
                [r for r in records if r['step'] <= 120] + [{**records[-1], 'step': 150, KEYS[0]: -1.0}],
                [r for r in records if r['step'] > 100]]
            for i, run in enumerate(runs):
                folder = cell / f'2026010{i + 1}_000000' / 'vis_data'
                folder.mkdir(parents=True)
                (folder / 'scalars.json').write_text(''.join(json.dumps(r) + '\n' for r in run))
    (root / 'suite.json').write_text(json.dumps(dict(best=[{**arm, 'seeds': SEEDS} for arm in arms])))


def exact_p(d):
    observed = abs(sum(d))
    flips = [abs(sum(s * x for s, x in zip(signs, d))) for signs in itertools.product((1, -1), repeat=len(d))]
    return np.mean([f >= observed - 1e-9 for f in flips])


def test_each_arm_and_its_ratio_to_the_reference_at_the_start_middle_and_end(tmp_path):
    write_records(tmp_path)
    attention_kappa.main([str(tmp_path), '--out-dir', str(tmp_path / 'out')])
    result = json.loads((tmp_path / 'out' / 'attention_kappa.json').read_text())
    assert result['phases'] == dict(start=1, middle=100, end=200)
    assert [q['key'] for q in result['quantities']] == [KEYS[0], KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]]
    for key in KEYS:
        for phase, step in result['phases'].items():
            for arm in ('base', 'cond'):
                logs = np.log10([kappa(arm, seed, key, step) for seed in SEEDS])
                low, high = stats.t.interval(0.95, len(logs) - 1, loc=logs.mean(), scale=stats.sem(logs))
                summary = result['table'][key][phase][arm]['summary']
                assert summary['geomean'] == pytest.approx(10 ** logs.mean(), rel=1e-9)
                assert (summary['low'], summary['high']) == pytest.approx((10 ** low, 10 ** high), rel=1e-9)
            d = np.log10([kappa('cond', s, key, step) / kappa('base', s, key, step) for s in SEEDS])
            low, high = stats.t.interval(0.95, len(d) - 1, loc=d.mean(), scale=stats.sem(d))
            ratio = result['table'][key][phase]['cond']['ratio']
            assert ratio['ratio'] == pytest.approx(10 ** d.mean(), rel=1e-9)
            assert (ratio['low'], ratio['high']) == pytest.approx((10 ** low, 10 ** high), rel=1e-9)
            assert ratio['p'] == pytest.approx(exact_p(d))
            assert result['table'][key][phase]['base']['ratio'] is None
    assert (tmp_path / 'out' / 'attention_kappa.png').stat().st_size > 0
    assert 'embedded tokens X | start (1) |' in (tmp_path / 'out' / 'attention_kappa.md').read_text()


def test_a_record_dir_without_a_gathered_suite_is_named(tmp_path):
    with pytest.raises(SystemExit) as error:
        attention_kappa.main([str(tmp_path)])
    assert error.value.code == 2


def fmt_singular(values):
    return f'singular on {sum(v > SINGULAR for v in values)} of {len(values)} seeds'


def test_a_value_just_above_2_to_the_24_is_singular_and_one_just_below_is_not():
    above, below = SINGULAR * (1 + 1e-9), SINGULAR * (1 - 1e-9)
    summary = attention_kappa.log_summary({3: above, 4: above})
    assert (summary['singular'], summary['singular_seeds']) == (True, 2)
    assert attention_kappa.fmt_summary(summary) == 'numerically singular (singular on 2 of 2 seeds)'
    summary = attention_kappa.log_summary({3: below, 4: below})
    assert (summary['singular'], summary['singular_seeds']) == (False, 0)
    assert attention_kappa.fmt_summary(summary) == '1.7e7 [1.7e7, 1.7e7]'
    # a geometric mean below 2**24 keeps its value, with the seed above it counted
    summary = attention_kappa.log_summary({3: above, 4: 1e3, 5: 1e3})
    assert (summary['singular'], summary['singular_seeds']) == (False, 1)
    assert attention_kappa.fmt_summary(summary).endswith(' (singular on 1 of 3 seeds)')


def test_a_ratio_with_one_singular_seed_in_either_arm_is_not_comparable():
    resolved = {3: 1e3, 4: 2e3, 5: 4e3}
    with_one = {**resolved, 4: SINGULAR * (1 + 1e-9)}
    just_below = {**resolved, 4: SINGULAR * (1 - 1e-9)}
    for values, reference, counts in [(with_one, resolved, (1, 0)), (resolved, with_one, (0, 1)),
                                      (just_below, resolved, (0, 0))]:
        ratio = attention_kappa.ratio(values, reference)
        assert (ratio['singular_seeds'], ratio['reference_singular_seeds']) == counts
        assert ratio['comparable'] == (counts == (0, 0))
        d = np.log10([values[s] / reference[s] for s in (3, 4, 5)])
        assert ratio['ratio'] == pytest.approx(10 ** d.mean(), rel=1e-9)  # the number is kept either way
        text = attention_kappa.fmt_ratio(ratio, 'cond', 'base')
        if ratio['comparable']:
            assert text.startswith('×') and 'p=' in text
        else:
            assert text == (f'not comparable: numerically singular on {counts[0]} of 3 seeds (cond) / {counts[1]} '
                            'of 3 (base)')


def cells_of(markdown_text, label, phase):
    """The arms' cells of the table row of ``label`` at ``phase``."""
    row = next(line for line in markdown_text.splitlines() if line.startswith(f'| {label} | {phase} ('))
    return [cell.strip() for cell in row.strip('|').split('|')][2:]


def test_the_table_counts_its_comparisons_and_flags_singular_cells_in_markdown_and_json(tmp_path):
    write_records(tmp_path)
    attention_kappa.main([str(tmp_path), '--out-dir', str(tmp_path / 'out')])
    result = json.loads((tmp_path / 'out' / 'attention_kappa.json').read_text())
    text = (tmp_path / 'out' / 'attention_kappa.md').read_text()
    labels = {q['key']: q['label'] for q in result['quantities']}
    comparable = 0
    for key in KEYS:
        for phase, step in result['phases'].items():
            values = {arm: [kappa(arm, seed, key, step) for seed in SEEDS] for arm in ('base', 'cond')}
            singular = {arm: sum(v > SINGULAR for v in values[arm]) for arm in values}
            entries = result['table'][key][phase]
            for arm in values:
                geomean = 10 ** np.log10(values[arm]).mean()
                assert entries[arm]['summary']['singular'] == (geomean > SINGULAR)
                assert entries[arm]['summary']['singular_seeds'] == singular[arm]
            ratio = entries['cond']['ratio']
            assert (ratio['singular_seeds'], ratio['reference_singular_seeds']) == (singular['cond'], singular['base'])
            assert ratio['comparable'] == (singular['cond'] == singular['base'] == 0)
            comparable += ratio['comparable']
            base_cell, cond_cell = cells_of(text, labels[key], phase)
            if 10 ** np.log10(values['base']).mean() > SINGULAR:
                assert base_cell == f'numerically singular ({fmt_singular(values["base"])})'
            if ratio['comparable']:
                assert f'p={ratio["p"]:.3g}' in cond_cell
            else:
                assert 'p=' not in cond_cell and '×' not in cond_cell
                assert cond_cell.endswith(f'not comparable: numerically singular on {singular["cond"]} of 3 seeds '
                                          f'(cond) / {singular["base"]} of 3 (base)')
    assert 0 < comparable < len(KEYS) * 3  # the records hold both kinds of cell
    assert result['comparisons'] == comparable
    assert result['p_floors'] == {'3': 0.25}
    header = text.splitlines()[0]
    assert f'; {comparable} comparisons (× with a p), none corrected for multiplicity' in header
    assert 'the smallest p the seeds allow: 0.25 with 3 seeds (2/2^3)' in header
    assert '"numerically singular": the geometric mean over the seeds of the mean over windows' in text
    assert 'tools/analysis/singular_attention.py measures it from a checkpoint' in text
    assert result['singular_kappa'] == SINGULAR
    # the JSON holds all the table says
    assert attention_kappa.markdown(result['arms'], [(q['key'], q['label']) for q in result['quantities']],
                                    result['phases'], result['table'], result['record_dir']) + '\n' == text
