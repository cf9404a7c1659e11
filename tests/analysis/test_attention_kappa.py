"""tools/analysis/attention_kappa.py: κ of the tokens and of each attention layer per arm of a suite run, at the
start, middle and end of training, against numpy/scipy on written hook records (a resumed cell included)."""
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


def kappa(arm, seed, key, step):
    """A distinct value per cell, quantity and iteration, spanning orders of magnitude."""
    return 10 ** (1 + KEYS.index(key) + 0.1 * seed ** (2 if arm == 'cond' else 1) + step / 100) * (
        3.0 if arm == 'cond' else 1.0)


def write_records(root):
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
