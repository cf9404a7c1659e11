"""tools/suites/save_suite_records.py: a suite run's finished cells kept without checkpoints (every training run of
a resumed cell, whose curves join them all), so that the runner gathers the same tables from the records and a
resumed run continues from them; and a diverged cell whose test ended without a result, kept with its record and
test log (one whose test never ended is not), which a run resumed from the records does not train again."""
import hashlib
import json
import math
import os
import os.path as osp

import pytest

from condtok_mm.suites import run_suite, save_suite_records
from helpers.suite_runs import BASELINE, CONDITIONED, record_fingerprints, run_runner, write_cell, write_suite

VARIANTS = dict(baseline=dict(config=BASELINE), cond=dict(config=CONDITIONED))
TEST_LOG = 'Traceback (most recent call last):\nValueError: the test of a diverged checkpoint\n'


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


def diverged_run(tmp_path, test_ended):
    """A suite run of 2 variants x 2 seeds at one rate: three finished cells, and cond seed 1, whose loss went
    non-finite and whose training ended (its final checkpoint there), with its test ended without a result (its
    test.log, its test JSON without COCO metrics, its record the checkpoint's SHA-256, as the runner leaves them)
    where ``test_ended``, else stopped before its test (none of them); returns (suite path, out dir)."""
    out_dir = tmp_path / 'out'
    for variant, seed, bbox in (('baseline', 0, 0.1), ('baseline', 1, 0.2), ('cond', 0, 0.3)):
        write_cell(str(out_dir), variant, 1e-3, seed, bbox, 0.05, [3.0, 2.0, 1.0])
    write_cell(str(out_dir), 'cond', 1e-3, 1, None, None, [3.0, math.nan, math.nan])
    suite = write_suite(tmp_path / 'suite.py', VARIANTS, seeds=(0, 1), lrs=(1e-3,),
                        cfg_options={'train_cfg.max_epochs': 1})
    record_fingerprints(suite, out_dir)
    if test_ended:
        cell = out_dir / 'cond' / 'lr0.001' / 'seed1'
        (cell / 'test.log').write_text(TEST_LOG)
        (cell / 'test' / '20260101_000100').mkdir(parents=True)
        (cell / 'test' / '20260101_000100' / '20260101_000100.json').write_text(json.dumps({'time': 1.0}))
        record = json.loads((cell / 'suite_cell.json').read_text())
        record['checkpoint_sha256'] = hashlib.sha256((cell / 'epoch_1.pth').read_bytes()).hexdigest()
        (cell / 'suite_cell.json').write_text(json.dumps(record))
    return suite, out_dir


@pytest.mark.parametrize('test_ended', [True, False], ids=['test-ended', 'never-tested'])
def test_a_diverged_cell_is_kept_without_its_checkpoint_where_its_test_ended_without_a_result(tmp_path, test_ended):
    suite, out_dir = diverged_run(tmp_path, test_ended)
    record_dir = tmp_path / 'records'
    cells = save_suite_records.save_records(str(out_dir), str(record_dir))
    finished = ['baseline/lr0.001/seed0', 'baseline/lr0.001/seed1', 'cond/lr0.001/seed0']
    assert cells == finished + (['cond/lr0.001/seed1'] if test_ended else [])
    diverged = [name for name in files_under(record_dir) if name.startswith('cond/lr0.001/seed1/')]
    if not test_ended:  # --resume tests it in the run's out dir, where its checkpoint is
        assert diverged == []
        return
    # no checkpoint: its record (the SHA-256 of the checkpoint the test ended on) and the test's log are the evidence
    assert diverged == [f'cond/lr0.001/seed1/{name}' for name in (
        '20260101_000000/vis_data/scalars.json', 'suite_cell.json', 'test.log',
        'test/20260101_000100/20260101_000100.json')]
    cell = record_dir / 'cond' / 'lr0.001' / 'seed1'
    assert (cell / 'suite_cell.json').read_text() == (out_dir / 'cond' / 'lr0.001' / 'seed1' / 'suite_cell.json'
                                                      ).read_text()
    assert json.loads((cell / 'suite_cell.json').read_text())['checkpoint_sha256'] == hashlib.sha256(b'').hexdigest()
    assert (cell / 'test.log').read_text() == TEST_LOG


def test_resume_from_the_records_does_not_train_a_kept_diverged_cell_again_and_the_run_tests_it_again(
        tmp_path, monkeypatch):
    """--resume from the records names the kept diverged cell and runs nothing (its checkpoint is not there to test
    again, and its record stays as saved); from the run's out dir it tests the cell again, as any failed test."""
    suite, out_dir = diverged_run(tmp_path, test_ended=True)
    record_dir = tmp_path / 'records'
    save_suite_records.save_records(str(out_dir), str(record_dir))
    saved = (record_dir / 'cond' / 'lr0.001' / 'seed1' / 'suite_cell.json').read_text()
    pending = []
    monkeypatch.setattr(run_suite, 'run_pending', lambda cells, *args: pending.append(
        [(cell.variant, cell.seed) for cell in cells]))
    result = run_runner(suite, '--out-dir', str(record_dir), '--resume')
    assert pending == [] and result.returncode == 1
    assert ('cell cond lr 0.001 seed 1: its loss diverged and its test ended without a result on its final checkpoint '
            f'({record_dir}/cond/lr0.001/seed1/test.log), which is not here to test again: not run; set its work dir '
            'aside to train it again') in result.stderr
    assert 'error: 1 of 4 cells did not finish: cond lr 0.001 seed 1 (failed' in result.stderr
    assert (record_dir / 'cond' / 'lr0.001' / 'seed1' / 'suite_cell.json').read_text() == saved
    statuses = {(c['variant'], c['seed']): c['status']
                for c in json.loads((record_dir / 'suite.json').read_text())['cells_detail']}
    assert statuses == {('baseline', 0): 'reused', ('baseline', 1): 'reused', ('cond', 0): 'reused',
                        ('cond', 1): 'failed'}
    run_runner(suite, '--out-dir', str(out_dir), '--resume')
    assert pending == [[('cond', 1)]]


def test_an_out_dir_that_is_not_there_is_named(tmp_path, capsys):
    with pytest.raises(SystemExit) as error:
        save_suite_records.main([str(tmp_path / 'missing'), str(tmp_path / 'records')])
    assert error.value.code == 2
    assert 'missing is not a directory (give the --out-dir of a suite run)' in capsys.readouterr().err
