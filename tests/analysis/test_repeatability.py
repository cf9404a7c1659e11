"""tools/analysis/repeatability.py: two runs of one cell compared bit for bit (weights), on their test metrics and
on their curves step by step, on written work dirs."""
import json

import pytest
import torch

from condtok_mm.analysis import repeatability


def write_run(work_dir, weights, losses, bbox, validations):
    work_dir.mkdir(parents=True)
    torch.save({'state_dict': weights, 'meta': {}}, work_dir / 'epoch_12.pth')
    folder = work_dir / '20260101_000000' / 'vis_data'
    folder.mkdir(parents=True)
    records = [dict(loss=loss, iter=10 * (i + 1), epoch=1, step=10 * (i + 1)) for i, loss in enumerate(losses)]
    records += [{'kappa/attn_softmax_mean/layer00': 100.0, 'step': 1}]
    records += [{'coco/bbox_mAP': value, 'step': epoch} for epoch, value in validations.items()]
    (folder / 'scalars.json').write_text(''.join(json.dumps(r) + '\n' for r in records))
    (work_dir / 'test' / '20260101_000100').mkdir(parents=True)
    (work_dir / 'test' / '20260101_000100' / '20260101_000100.json').write_text(
        json.dumps({'coco/bbox_mAP': bbox, 'coco/segm_mAP': bbox / 2}))


def test_identical_runs_and_runs_that_part_at_one_iteration(tmp_path):
    weights = {'a': torch.arange(6.0).reshape(2, 3), 'b': torch.ones(4)}
    write_run(tmp_path / 'one', weights, [3.0, 2.0, 1.5, 1.0], 0.189, {3: 0.01, 6: 0.1})
    write_run(tmp_path / 'two', {k: v.clone() for k, v in weights.items()}, [3.0, 2.0, 1.5, 1.0], 0.189,
              {3: 0.01, 6: 0.1})
    other = {'a': weights['a'] + torch.tensor([[0, 0, 2.0 ** -10], [0, 0, 0]]), 'b': torch.ones(4)}
    write_run(tmp_path / 'three', other, [3.0, 2.0, 1.25, 1.5], 0.201, {3: 0.01, 6: 0.12})

    same, _, _ = repeatability.compare(str(tmp_path / 'one'), str(tmp_path / 'two'), 'epoch_12.pth')
    assert same['weights'] == dict(tensors=2, identical=2, differing=[], max_abs=0.0, max_rel=0.0)
    assert same['metrics']['coco/bbox_mAP'] == dict(a=18.9, b=18.9, difference=0.0)
    assert all(curve['differing'] == 0 for curve in same['curves'].values())

    apart, _, _ = repeatability.compare(str(tmp_path / 'one'), str(tmp_path / 'three'), 'epoch_12.pth')
    assert apart['weights']['identical'] == 1 and apart['weights']['differing'] == ['a']
    assert apart['weights']['max_abs'] == 2.0 ** -10
    assert apart['metrics']['coco/bbox_mAP']['difference'] == pytest.approx(1.2)
    assert apart['curves']['loss'] == dict(steps=4, differing=2, first_differing=30, max_abs=0.5)
    assert apart['curves']['validation coco/bbox_mAP'] == dict(steps=2, differing=1, first_differing=6,
                                                                max_abs=pytest.approx(2.0))
    assert apart['curves']['kappa/attn_softmax_mean/layer00']['differing'] == 0


def test_the_tool_writes_its_table_json_and_plot(tmp_path, capsys):
    weights = {'a': torch.ones(2)}
    write_run(tmp_path / 'one', weights, [2.0, 1.0], 0.1, {})
    write_run(tmp_path / 'two', weights, [2.0, 1.0], 0.1, {})
    repeatability.main([str(tmp_path / 'one'), str(tmp_path / 'two'), '--out-dir', str(tmp_path / 'out')])
    printed = capsys.readouterr().out
    assert 'weights (epoch_12.pth): 1 of 1 tensors bit-identical' in printed and 'loss: identical' in printed
    assert json.loads((tmp_path / 'out' / 'repeatability.json').read_text())['weights']['identical'] == 1
    assert (tmp_path / 'out' / 'repeatability.png').stat().st_size > 0


def test_two_runs_that_diverged_identically_are_identical_and_the_json_stays_valid(tmp_path):
    nan = float('nan')
    weights = {'a': torch.tensor([1.0, nan])}
    write_run(tmp_path / 'one', weights, [2.0, nan], 0.0, {})
    write_run(tmp_path / 'two', {'a': torch.tensor([1.0, nan])}, [2.0, nan], 0.0, {})
    write_run(tmp_path / 'three', {'a': torch.tensor([1.0, 3.0])}, [2.0, 1.0], 0.0, {})
    same, _, _ = repeatability.compare(str(tmp_path / 'one'), str(tmp_path / 'two'), 'epoch_12.pth')
    assert same['weights']['identical'] == 1 and same['curves']['loss']['differing'] == 0
    apart, _, _ = repeatability.compare(str(tmp_path / 'one'), str(tmp_path / 'three'), 'epoch_12.pth')
    assert apart['weights']['identical'] == 0 and apart['curves']['loss'] == dict(
        steps=2, differing=1, first_differing=20, max_abs=float('inf'))
    repeatability.main([str(tmp_path / 'one'), str(tmp_path / 'three'), '--out-dir', str(tmp_path / 'out')])
    written = json.loads((tmp_path / 'out' / 'repeatability.json').read_text())  # strict JSON: no NaN/Infinity
    assert written['curves']['loss']['max_abs'] is None and written['weights']['max_abs'] is None
