"""tools/analysis/dose_response.py: each method's curve from a written suite run, checked against numpy/scipy."""
import json

import numpy as np
import pytest
from scipy import stats

from condtok_mm.analysis import dose_response
from helpers.suite_runs import BASELINE, CONDITIONED

KNOB = 'condtok=model.backbone.conditioning.target_kappa'


# bbox AP by (variant, lr, seed); the baseline is best at 2e-3, the method at 1e-3 (where its dose runs)
BBOX = {('baseline', 1e-3): [1.0, 2.0, 1.5], ('baseline', 2e-3): [2.0, 2.5, 3.5],
        ('condtok', 1e-3): [5.0, 7.0, 4.0], ('condtok', 2e-3): [3.0, 3.0, 3.0],
        ('condtok_k8', 1e-3): [4.0, 8.0, 2.0]}


def write_run(tmp_path, bbox=BBOX):
    suite = tmp_path / 'dose.py'
    suite.write_text(
        "reference = 'baseline'\nseeds = [0, 1, 2]\nlrs = [1e-3, 2e-3]\n"
        f"variants = dict(baseline=dict(config={BASELINE!r}), condtok=dict(config={CONDITIONED!r}),\n"
        f"                condtok_k8=dict(config={CONDITIONED!r}, lrs=dict(best_of='condtok'),\n"
        "                                cfg_options={'model.backbone.conditioning.target_kappa': 8.0}))\n")
    cells = [dict(variant=variant, lr=lr, seed=seed,
                  results=dict(metrics={'coco/bbox_mAP': value, 'coco/segm_mAP': value / 2}))
             for (variant, lr), values in bbox.items() for seed, value in enumerate(values)]
    out_dir = tmp_path / 'out'
    out_dir.mkdir()
    (out_dir / 'suite.json').write_text(json.dumps(dict(reference='baseline', metric='coco/bbox_mAP',
                                                        cells_detail=cells)))
    return str(suite), out_dir


def t_interval(differences):
    differences = np.asarray(differences, dtype=np.float64)
    half = stats.t.ppf(0.975, len(differences) - 1) * differences.std(ddof=1) / np.sqrt(len(differences))
    return differences.mean() - half, differences.mean() + half


def test_curve_points_strengths_and_paired_differences(tmp_path, capsys):
    suite, out_dir = write_run(tmp_path)
    dose_response.main([suite, '--knob', KNOB, '--out-dir', str(out_dir)])
    result = json.loads((out_dir / 'dose.json').read_text())
    assert result['reference']['lr'] == 2e-3  # the baseline's best rate by mean bbox AP
    curve = result['methods']['condtok']
    assert curve['lr'] == 1e-3 and curve['key'] == 'model.backbone.conditioning.target_kappa'
    published, dose = curve['points']
    # the published strength comes from the config itself (no cfg_options), the dose's from its cfg_options
    assert (published['variant'], published['strength'], published['published']) == ('condtok', 2.0, True)
    assert (dose['variant'], dose['strength'], dose['published']) == ('condtok_k8', 8.0, False)
    k8, k2, base = (np.array(BBOX[key]) for key in (('condtok_k8', 1e-3), ('condtok', 1e-3), ('baseline', 2e-3)))
    assert dose['metrics']['coco/bbox_mAP']['mean'] == pytest.approx(k8.mean())
    assert dose['metrics']['coco/bbox_mAP']['std'] == pytest.approx(k8.std(ddof=1))
    assert dose['metrics']['coco/segm_mAP']['mean'] == pytest.approx(k8.mean() / 2)
    versus = dose['difference_vs_published']['coco/bbox_mAP']
    assert versus['mean'] == pytest.approx((k8 - k2).mean())
    assert (versus['low'], versus['high']) == pytest.approx(t_interval(k8 - k2))
    versus = dose['difference_vs_reference']['coco/bbox_mAP']
    assert (versus['low'], versus['high']) == pytest.approx(t_interval(k8 - base))
    assert published['difference_vs_published'] == {}
    assert (out_dir / 'dose.png').read_bytes()[:4] == b'\x89PNG'
    table = (out_dir / 'dose.md').read_text()
    assert '| condtok | target_kappa 2 (published) | 0.001 | 0, 1, 2 | 5.3 ± 1.5 |' in table
    assert '| condtok | target_kappa 8 | 0.001 | 0, 1, 2 | 4.7 ± 3.1 |' in table
    assert '| condtok | target_kappa 8 | 0.001 |' in capsys.readouterr().out  # the table is printed too


def test_refuses_an_unknown_method_doses_at_two_rates_and_a_missing_run(tmp_path):
    suite, out_dir = write_run(tmp_path)
    with pytest.raises(SystemExit, match="no variant 'spectral'"):
        dose_response.main([suite, '--knob', 'spectral=model.backbone.lam', '--out-dir', str(out_dir)])
    with pytest.raises(SystemExit, match='expected METHOD=KEY'):
        dose_response.main([suite, '--knob', 'condtok', '--out-dir', str(out_dir)])
    with pytest.raises(SystemExit, match="has no 'model.backbone.lam'"):
        dose_response.main([suite, '--knob', 'condtok=model.backbone.lam', '--out-dir', str(out_dir)])
    with pytest.raises(SystemExit, match='no .*suite.json; run tools/suites/run_suite.py'):
        dose_response.main([suite, '--knob', KNOB, '--out-dir', str(tmp_path / 'nothing')])
    (tmp_path / 'two').mkdir()
    suite, out_dir = write_run(tmp_path / 'two', {**BBOX, ('condtok_k8', 2e-3): [1.0, 1.0, 1.0]})
    with pytest.raises(SystemExit, match='ran at several rates'):
        dose_response.main([suite, '--knob', KNOB, '--out-dir', str(out_dir)])
