"""tools/suites/save_suite_records.py: a suite run's finished cells kept without checkpoints (every training run of
a resumed cell, whose curves join them all), so that the runner gathers the same tables from the records and a
resumed run continues from them."""
import json
import os
import os.path as osp

import pytest

from condtok_mm.suites import save_suite_records
from helpers.suite_runs import BASELINE, CONDITIONED, record_fingerprints, run_runner, write_cell, write_suite

VARIANTS = dict(baseline=dict(config=BASELINE), cond=dict(config=CONDITIONED))


def written_run(tmp_path):
    """A suite run of 2 variants x 2 seeds at one rate: three finished cells (one tested twice, one trained
    twice), one trained but untested; returns (suite path, out dir)."""
    out_dir = tmp_path / 'out'
    for variant, seed, bbox in (('baseline', 0, 0.1), ('baseline', 1, 0.2), ('cond', 0, 0.3), ('cond', 1, None)):
        write_cell(str(out_dir), variant, 1e-3, seed, bbox, 0.05, [3.0, 2.0, 1.0])
    cell = out_dir / 'cond' / 'lr0.001' / 'seed0'
    older_test = cell / 'test' / '20250101_000000'  # an earlier evaluation: the newest one is the cell's
    older_test.mkdir()
    (older_test / '20250101_000000.json').write_text(json.dumps({'coco/bbox_mAP': 0.9, 'coco/segm_mAP': 0.9}))
    older_train = cell / '20250101_000000' / 'vis_data'
    older_train.mkdir(parents=True)
    (older_train / 'scalars.json').write_text(json.dumps(dict(loss=9.0, iter=10, step=10)) + '\n')
    suite = write_suite(tmp_path / 'suite.py', VARIANTS, seeds=(0, 1), lrs=(1e-3,),
                        cfg_options={'train_cfg.max_epochs': 1})
    record_fingerprints(suite, out_dir)
    return suite, out_dir


def gathered(suite, out_dir):
    """Each gathered cell's results; the untested cell makes --gather-only exit with 1 after writing the tables."""
    result = run_runner(suite, '--out-dir', str(out_dir), '--gather-only')
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    assert 'error: 1 of 4 cells did not finish: cond lr 0.001 seed 1' in result.stderr
    summary = json.loads((out_dir / 'suite.json').read_text())
    return {(c['variant'], c['seed']): {key: c['results'].get(key) for key in ('metrics', 'loss', 'final_loss')}
            | dict(status=c['status']) for c in summary['cells_detail']}


def files_under(root):
    return sorted(osp.relpath(osp.join(d, name), root) for d, _, names in os.walk(root) for name in names)


def test_the_records_hold_each_finished_cells_fingerprint_newest_test_and_every_training_run(tmp_path):
    suite, out_dir = written_run(tmp_path)
    record_dir = tmp_path / 'records'
    cells = save_suite_records.save_records(str(out_dir), str(record_dir))
    assert cells == ['baseline/lr0.001/seed0', 'baseline/lr0.001/seed1', 'cond/lr0.001/seed0']
    assert files_under(record_dir) == sorted(
        [f'{cell}/{name}' for cell in cells for name in (
            'suite_cell.json', 'test/20260101_000100/20260101_000100.json', '20260101_000000/vis_data/scalars.json')]
        + ['cond/lr0.001/seed0/20250101_000000/vis_data/scalars.json'])  # a resumed cell's earlier run too


def test_the_runner_gathers_the_same_results_from_the_records_and_would_resume_only_the_rest(tmp_path):
    suite, out_dir = written_run(tmp_path)
    record_dir = tmp_path / 'records'
    save_suite_records.main([str(out_dir), str(record_dir)])
    from_run = gathered(suite, out_dir)
    from_records = gathered(suite, record_dir)
    finished = [('baseline', 0), ('baseline', 1), ('cond', 0)]
    assert {key: from_records[key] for key in finished} == {key: from_run[key] for key in finished}
    # each recorded cell passed the fingerprint check ('reused'): --resume would run only the missing one
    assert {key: value['status'] for key, value in from_records.items()} == {
        ('baseline', 0): 'reused', ('baseline', 1): 'reused', ('cond', 0): 'reused', ('cond', 1): 'missing'}
    assert from_records[('cond', 1)] == dict(metrics=None, loss=dict(iter=[], value=[]), final_loss=None,
                                             status='missing')
    assert from_records[('cond', 0)]['metrics']['coco/bbox_mAP'] == 30.0  # the newest test, not the older 90
    assert from_records[('cond', 0)]['final_loss'] == 1.0  # the newest training's, which redid the older's
    assert from_records[('cond', 0)]['loss'] == dict(iter=[10, 20, 30], value=[3.0, 2.0, 1.0])


def test_an_out_dir_that_is_not_there_is_named(tmp_path, capsys):
    with pytest.raises(SystemExit) as error:
        save_suite_records.main([str(tmp_path / 'missing'), str(tmp_path / 'records')])
    assert error.value.code == 2
    assert 'missing is not a directory (give the --out-dir of a suite run)' in capsys.readouterr().err
