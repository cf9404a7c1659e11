"""condtok_mm/suites/fingerprint.py: a suite uses a cell of its out dir only when the cell records the
fingerprint the suite asks for (on written runs; tests/suites/test_run_suite.py has the runner's own cells)."""
import argparse
import hashlib
import json
import os.path as osp
import re
import subprocess

import pytest
import torch

from condtok_mm.suites import launch
from condtok_mm.suites.fingerprint import (FINGERPRINT_FILE, FORMAT_KEY, RECORD_FORMAT, cell_record, differences,
                                              fingerprint, input_files, recorded_fingerprint, source_commit,
                                              write_fingerprint)
from condtok_mm.suites.results import UnreadableCellFile
from condtok_mm.suites.plan import Cell
from condtok_mm.utils.machine import cpu_kind
from helpers.repo import REPO_ROOT
from helpers.loopback_server import serving
from helpers.suite_runs import BASELINE, CONDITIONED, record_fingerprints, run_runner, write_cell, write_suite

ONE_EPOCH = {'train_cfg.max_epochs': 1}
# a fingerprint with every key, for cells whose config is not read
WRITTEN_FINGERPRINT = dict(config={}, options=[], seed=0, lr=1e-3, version='v', inputs={})


def one_rate_suite(path, variants, cfg_options=ONE_EPOCH):
    return write_suite(path, variants, lrs=(1e-3, ), cfg_options=cfg_options)


def written_suite(tmp_path, fingerprints=True):
    """Suite A's cells (baseline, cond; 2 seeds) as its run left them."""
    out_dir = tmp_path / 'out'
    for variant in ('baseline', 'cond'):
        for seed in (0, 1):
            write_cell(str(out_dir), variant, 1e-3, seed, 0.1 + 0.01 * seed, 0.05, [2.0, 1.0])
    path = one_rate_suite(tmp_path / 'a.py', dict(baseline=dict(config=BASELINE), cond=dict(config=CONDITIONED)))
    if fingerprints:
        record_fingerprints(path, out_dir)
    return path, out_dir


def gather(path, out_dir, *extra):
    return run_runner(path, '--out-dir', str(out_dir), '--gather-only', *extra)


def test_the_suite_that_ran_gathers_its_own_cells(tmp_path):
    path, out_dir = written_suite(tmp_path)
    result = gather(path, out_dir)
    assert result.returncode == 0, result.stderr[-3000:]
    assert [c['status'] for c in json.loads((out_dir / 'suite.json').read_text())['cells_detail']] == ['reused'] * 4


def test_another_suite_in_the_same_out_dir_is_refused_naming_each_cell_and_what_differs(tmp_path):
    _, out_dir = written_suite(tmp_path)
    # suite B: its "cond" is another model (the baseline config with a scale option) under the same names
    other = one_rate_suite(tmp_path / 'b.py', dict(baseline=dict(config=BASELINE), cond=dict(
        config=BASELINE, cfg_options={'model.backbone.drop_path_rate': 0.2})))
    result = gather(other, out_dir)
    assert result.returncode == 1 and not (out_dir / 'suite.json').exists()
    assert 'error: 2 cell(s) under' in result.stderr and 'are not those of b:' in result.stderr
    for seed in (0, 1):
        assert f'cell cond lr 0.001 seed {seed} ({out_dir}/cond/lr0.001/seed{seed}) is not the cell' in result.stderr
    assert "config model.backbone.type: 'CondSwinTransformer' recorded, 'SwinTransformer' now" in result.stderr
    assert "config model.backbone.drop_path_rate: 0.1 recorded, 0.2 now" in result.stderr
    assert 'options: +model.backbone.drop_path_rate=0.2' in result.stderr
    assert 'cell baseline' not in result.stderr  # the same cell in both suites
    assert '--resume --rerun-changed sets the changed cells aside' in result.stderr


def test_a_suite_whose_common_options_changed_is_refused_for_every_cell(tmp_path):
    path, out_dir = written_suite(tmp_path)
    one_rate_suite(tmp_path / 'a.py', dict(baseline=dict(config=BASELINE), cond=dict(config=CONDITIONED)),
                   cfg_options={'train_cfg.max_epochs': 2})
    result = gather(path, out_dir)
    assert result.returncode == 1 and result.stderr.count('is not the cell this suite asks for') == 4
    assert result.stderr.count('config train_cfg.max_epochs: 1 recorded, 2 now') == 4


def test_cells_without_a_fingerprint_are_refused_unless_accepted_and_then_named(tmp_path):
    path, out_dir = written_suite(tmp_path, fingerprints=False)
    result = gather(path, out_dir)
    assert result.returncode == 1
    assert result.stderr.count('records no fingerprint (suite_cell.json)') == 4
    assert '--accept-unfingerprinted uses the cells that record none as they are' in result.stderr
    accepted = gather(path, out_dir, '--accept-unfingerprinted')
    assert accepted.returncode == 0, accepted.stderr[-3000:]
    summary = json.loads((out_dir / 'suite.json').read_text())
    assert summary['unfingerprinted'] == [c['work_dir'] for c in summary['cells_detail']]
    assert 'Reused without a fingerprint (--accept-unfingerprinted' in (out_dir / 'suite.md').read_text()


def test_differences_name_config_keys_options_seed_rate_and_version():
    recorded = dict(config=dict(model=dict(a=1, b=[1, 2], c=dict(d='x'))), options=['k=1', 'j=2'], seed=0, lr=1e-3,
                    version='0.1.0', inputs={})
    current = dict(config=dict(model=dict(a=1, b=[1, 3], e=5)), options=['k=1', 'm=3'], seed=1, lr=1e-3,
                   version='0.2.0', inputs={})
    assert differences(recorded, current) == [  # the shallowest keys first
        "config model.b: [1, 2] recorded, [1, 3] now", "config model.e: '<absent>' recorded, 5 now",
        "config model.c.d: 'x' recorded, '<absent>' now", 'options: -j=2, +m=3', 'seed: 0 recorded, 1 now',
        "version: '0.1.0' recorded, '0.2.0' now"]
    assert differences(recorded, recorded) == []
    assert differences(recorded, dict(recorded, options=['j=2', 'k=1'])) == [
        'options: the same options in another order (the last of a key wins)']
    many = dict(recorded, config={f'k{i}': i for i in range(9)})
    assert differences(many, dict(many, config={}))[-1] == 'config: 3 more keys differ'


def test_the_files_a_config_reads_are_its_checkpoints_and_its_annotations_under_their_data_root():
    config = dict(load_from='work_dirs/a.pth', model=dict(backbone=dict(init_cfg=dict(
        type='Pretrained', checkpoint='https://example.org/swin.pth', prefix='backbone.'))),
        train_dataloader=dict(dataset=dict(type='RepeatDataset', dataset=dict(
            data_root='data/shapes/', ann_file='annotations/train.json'))),
        val_evaluator=[dict(type='CocoMetric', ann_file='data/shapes/annotations/val.json')],
        test_dataloader=dict(dataset=dict(data_root='data/coco/', ann_file='/abs/val.json')))
    assert input_files(config) == {
        'load_from': 'work_dirs/a.pth', 'model.backbone.init_cfg.checkpoint': 'https://example.org/swin.pth',
        'train_dataloader.dataset.dataset.ann_file': 'data/shapes/annotations/train.json',
        'val_evaluator.0.ann_file': 'data/shapes/annotations/val.json',
        'test_dataloader.dataset.ann_file': '/abs/val.json'}


def input_suite(tmp_path):
    """A suite whose two cells (one seed) read a checkpoint and an annotation file of the test's own, written
    with their cells; returns (suite path, out dir, checkpoint, annotation file)."""
    checkpoint, annotations = tmp_path / 'pretrained.pth', tmp_path / 'data' / 'train.json'
    annotations.parent.mkdir()
    checkpoint.write_bytes(b'weights')
    annotations.write_text('{"images": []}')
    out_dir = tmp_path / 'out'
    for variant in ('baseline', 'cond'):
        write_cell(str(out_dir), variant, 1e-3, 0, 0.1, 0.05, [2.0, 1.0])
    path = write_suite(tmp_path / 'a.py', dict(baseline=dict(config=BASELINE), cond=dict(config=CONDITIONED)),
                       seeds=(0, ), lrs=(1e-3, ), cfg_options={
                           'train_cfg.max_epochs': 1, 'load_from': str(checkpoint),
                           'train_dataloader.dataset.data_root': str(annotations.parent) + '/',
                           'train_dataloader.dataset.ann_file': 'train.json'})
    record_fingerprints(path, out_dir)
    return path, out_dir, checkpoint, annotations


def test_each_cell_records_the_sha256_of_its_checkpoint_and_annotations(tmp_path):
    path, out_dir, checkpoint, annotations = input_suite(tmp_path)
    record = json.loads((out_dir / 'cond' / 'lr0.001' / 'seed0' / FINGERPRINT_FILE).read_text())
    assert record['inputs']['load_from'] == dict(
        path=str(checkpoint), digest='sha256:' + hashlib.sha256(b'weights').hexdigest())
    assert record['inputs']['train_dataloader.dataset.ann_file'] == dict(
        path=str(annotations), digest='sha256:' + hashlib.sha256(b'{"images": []}').hexdigest())
    assert gather(path, out_dir).returncode == 0


def test_a_checkpoint_or_annotation_file_changed_under_the_same_path_is_another_cell(tmp_path):
    path, out_dir, checkpoint, annotations = input_suite(tmp_path)
    checkpoint.write_bytes(b'weights trained again')
    result = gather(path, out_dir)
    assert result.returncode == 1 and result.stderr.count('is not the cell this suite asks for') == 2
    new = hashlib.sha256(b'weights trained again').hexdigest()
    assert f'input load_from: sha256:{hashlib.sha256(b"weights").hexdigest()} recorded, sha256:{new} now ' \
        f'({checkpoint})' in result.stderr
    checkpoint.write_bytes(b'weights')  # the same bytes again: the same cells
    assert gather(path, out_dir).returncode == 0
    annotations.unlink()
    result = gather(path, out_dir)
    assert result.returncode == 1
    assert result.stderr.count('input train_dataloader.dataset.ann_file: sha256:') == 2
    assert f'recorded, <none> now ({annotations})' in result.stderr


def test_a_url_checkpoint_is_recorded_with_the_sha256_of_the_file_each_url_loads(tmp_path, monkeypatch):
    monkeypatch.setenv('TORCH_HOME', str(tmp_path / 'torch_home'))
    monkeypatch.setenv('NO_PROXY', '127.0.0.1,localhost')
    monkeypatch.setenv('no_proxy', '127.0.0.1,localhost')
    monkeypatch.setattr(torch.hub, '_hub_dir', None)
    served = tmp_path / 'served'
    for version in ('v1', 'v2'):
        (served / version).mkdir(parents=True)
        (served / version / 'model.pth').write_bytes(f'weights {version}'.encode())
    with serving(served) as url:
        digests = {}
        for version in ('v1', 'v2'):
            cell = Cell('baseline', 1e-3, 0, str(tmp_path / version), BASELINE, osp.join(REPO_ROOT, BASELINE),
                        options=[f'load_from={url}/{version}/model.pth'])
            digests[version] = fingerprint(cell, REPO_ROOT)['inputs']['load_from']
    assert digests == {version: dict(path=f'{url}/{version}/model.pth',
                                     digest='sha256:' + hashlib.sha256(f'weights {version}'.encode()).hexdigest())
                       for version in ('v1', 'v2')}


def test_a_format_1_record_without_inputs_is_refused_with_how_to_use_it(tmp_path):
    path, out_dir, _, _ = input_suite(tmp_path)
    for variant in ('baseline', 'cond'):
        record_path = out_dir / variant / 'lr0.001' / 'seed0' / FINGERPRINT_FILE
        record = json.loads(record_path.read_text())
        del record['inputs'], record[FORMAT_KEY]
        record_path.write_text(json.dumps(record))
    result = gather(path, out_dir)
    assert result.returncode == 1
    assert result.stderr.count('inputs: not recorded (its record, of format 1, holds no digests of the files it '
                               'read: gather or resume it with the commit it ran at, or --rerun-changed)') == 2


def test_the_commit_beside_a_fingerprint_is_the_checkouts_marked_when_tracked_files_changed(tmp_path):
    def git(*args):
        subprocess.run(['git', '-C', str(tmp_path), *args], check=True, capture_output=True)
    assert source_commit(str(tmp_path)) is None  # not a git checkout
    git('init', '-q')
    (tmp_path / 'a.py').write_text('x = 1\n')
    git('add', 'a.py')
    git('-c', 'user.name=t', '-c', 'user.email=t@t', 'commit', '-qm', 'a')
    head = subprocess.run(['git', '-C', str(tmp_path), 'rev-parse', '--short=12', 'HEAD'], capture_output=True,
                          text=True).stdout.strip()
    for change, expected in ((None, head), ('untracked.py', head), ('a.py', head + '+changes')):
        if change:
            (tmp_path / change).write_text('y = 2\n')
        assert source_commit(str(tmp_path)) == expected
    # a long run sees the checkout move on between its cells: each reads the commit it runs at
    git('-c', 'user.name=t', '-c', 'user.email=t@t', 'commit', '-qam', 'b')
    moved = subprocess.run(['git', '-C', str(tmp_path), 'rev-parse', '--short=12', 'HEAD'], capture_output=True,
                           text=True).stdout.strip()
    assert moved != head and source_commit(str(tmp_path)) == moved


def test_suite_md_says_which_commits_and_cpus_its_cells_ran_at(tmp_path):
    path, out_dir = written_suite(tmp_path)
    for variant, seed, commit, cpu in (('baseline', 0, 'abc', 'AMD EPYC'), ('baseline', 1, 'abc', 'AMD EPYC'),
                                       ('cond', 0, 'def+changes', 'Intel Xeon')):
        record_path = out_dir / variant / 'lr0.001' / f'seed{seed}' / FINGERPRINT_FILE
        record_path.write_text(json.dumps(dict(json.loads(record_path.read_text()), commit=commit, cpu=cpu)))
    assert gather(path, out_dir).returncode == 0
    summary = json.loads((out_dir / 'suite.json').read_text())
    assert summary['commits'] == {'abc': 2, 'def+changes': 1, 'not recorded': 1}
    assert summary['cpus'] == {'AMD EPYC': 2, 'Intel Xeon': 1, 'not recorded': 1}
    table = (out_dir / 'suite.md').read_text()
    assert 'Commits the cells ran at: abc (2), def+changes (1), not recorded (1); CPUs: AMD EPYC (2), ' \
        'Intel Xeon (1), not recorded (1) (a cell reruns bit-identically at one commit on one kind of CPU' in table


def test_a_cells_record_keeps_the_time_of_every_command_that_made_it_across_resumes(tmp_path, monkeypatch):
    """run_cell with commands that only advance a clock and leave the files mmengine would: an interrupted
    training (100 s), then its resume (50 s) and test (10 s), recorded 160 s; trained again from the start (no
    checkpoint left), only that run's 40 s."""
    work_dir = tmp_path / 'v' / 'lr0.001' / 'seed0'
    cell = Cell(variant='v', lr=1e-3, seed=0, work_dir=str(work_dir), config=BASELINE, config_path=BASELINE,
                checkpoint=str(work_dir / 'epoch_12.pth'), fingerprint=WRITTEN_FINGERPRINT)
    clock = [0.0]
    steps = []  # (seconds, files written, exit code) of each command, in the order they run

    def run_logged(children, command, log_path, env, root):
        seconds, files, returncode = steps.pop(0)
        clock[0] += seconds
        for name, text in files.items():
            (work_dir / name).parent.mkdir(parents=True, exist_ok=True)
            (work_dir / name).write_text(text)
        return returncode

    monkeypatch.setattr(launch, 'run_logged', run_logged)
    monkeypatch.setattr(launch.time, 'perf_counter', lambda: clock[0])
    args = argparse.Namespace(launcher='none', jobs=1, nproc=1, partition=None)
    test_json = {'test/1/1.json': json.dumps({'coco/bbox_mAP': 0.1})}

    steps[:] = [(100.0, {'last_checkpoint': 'epoch_6.pth'}, 1)]
    assert launch.run_cell(cell, args, 0, REPO_ROOT, launch.Children()).status == 'failed'
    assert cell_record(cell)['wall_s'] == 100.0
    steps[:] = [(50.0, {'epoch_12.pth': ''}, 0), (10.0, test_json, 0)]
    assert launch.run_cell(cell, args, 0, REPO_ROOT, launch.Children()).status == 'ran'
    assert (cell.resume, cell.wall_s, cell_record(cell)['wall_s']) == (True, 160.0, 160.0)
    record = json.loads((work_dir / FINGERPRINT_FILE).read_text())
    assert record['seed'] == 0  # the fingerprint kept beside it, and the CPU the commands ran on
    assert record['cpu'] == cpu_kind() and record['cpu'].endswith(')')

    for name in ('last_checkpoint', 'epoch_12.pth', 'test/1/1.json'):
        (work_dir / name).unlink()
    steps[:] = [(30.0, {'epoch_12.pth': ''}, 0), (10.0, test_json, 0)]
    assert launch.run_cell(cell, args, 0, REPO_ROOT, launch.Children()).status == 'ran'
    assert (cell.resume, cell_record(cell)['wall_s']) == (False, 40.0)


def test_suite_md_says_what_the_cells_records_say_their_commands_took(tmp_path):
    path, out_dir = written_suite(tmp_path)
    for variant, seed, wall_s in (('baseline', 0, 300.0), ('baseline', 1, 420.0), ('cond', 0, 600.0)):
        record_path = out_dir / variant / 'lr0.001' / f'seed{seed}' / FINGERPRINT_FILE
        record_path.write_text(json.dumps(dict(json.loads(record_path.read_text()), wall_s=wall_s)))
    assert gather(path, out_dir).returncode == 0
    assert json.loads((out_dir / 'suite.json').read_text())['cell_times'] == dict(
        total_s=1320.0, min_s=300.0, max_s=600.0, recorded=3, cells=4)
    assert ("the cells' own train and test commands took 22.0 min in all, 5.0–10.0 min a cell (3 of 4 cells record "
            "it)") in (out_dir / 'suite.md').read_text()


def test_a_url_digest_not_known_on_one_side_is_not_a_difference():
    def record(digest):
        return dict(config={}, options=[], seed=0, lr=1e-3, version='v', inputs={
            'load_from': dict(path='https://example.org/model.pth', digest=digest),
            'ann_file': dict(path='data/a.json', digest='sha256:aa')})
    assert differences(record('sha256:1'), record(None)) == []  # not fetched now (offline)
    assert differences(record(None), record('sha256:1')) == []  # not fetched when recorded (or format 1)
    assert differences(record('sha256:1'), record('sha256:2')) == [
        'input load_from: sha256:1 recorded, sha256:2 now (https://example.org/model.pth)']
    local = record('sha256:1')
    local['inputs']['ann_file']['digest'] = None
    assert len(differences(record('sha256:1'), local)) == 1  # a local file that is gone still differs


def test_a_cells_cpus_are_this_machines_for_local_commands_and_kept_across_resumes():
    assert launch.cell_cpus(None, 'none') == cpu_kind()
    assert launch.cell_cpus(None, 'slurm') is None  # its processes may run on other nodes
    assert launch.cell_cpus('Other CPU (AVX2)', 'none') == f'Other CPU (AVX2); {cpu_kind()}'
    assert launch.cell_cpus('Other CPU (AVX2)', 'pytorch') == 'Other CPU (AVX2)'
    assert launch.cell_cpus(f'Other CPU (AVX2); {cpu_kind()}', 'none') == f'Other CPU (AVX2); {cpu_kind()}'


def test_a_resumed_cells_record_keeps_the_cpus_of_its_earlier_runs(tmp_path, monkeypatch):
    work_dir = tmp_path / 'v' / 'lr0.001' / 'seed0'
    cell = Cell(variant='v', lr=1e-3, seed=0, work_dir=str(work_dir), config=BASELINE, config_path=BASELINE,
                checkpoint=str(work_dir / 'epoch_12.pth'), fingerprint=WRITTEN_FINGERPRINT)
    write_fingerprint(cell, cell.fingerprint, wall_s=5.0, cpu='Other CPU (AVX2)')
    (work_dir / 'last_checkpoint').write_text('epoch_6.pth')  # interrupted: it resumes
    monkeypatch.setattr(launch, 'run_logged', lambda *args: 1)
    launch.run_cell(cell, argparse.Namespace(launcher='none', jobs=1, nproc=1, partition=None), 0, REPO_ROOT,
                    launch.Children())
    record = json.loads((work_dir / FINGERPRINT_FILE).read_text())
    assert record['cpu'] == f'Other CPU (AVX2); {cpu_kind()}' and record['wall_s'] >= 5.0


def record_cell(tmp_path):
    work_dir = tmp_path / 'v' / 'lr0.001' / 'seed0'
    return Cell(variant='v', lr=1e-3, seed=0, work_dir=str(work_dir), config=BASELINE, config_path=BASELINE,
                checkpoint=str(work_dir / 'epoch_12.pth'), fingerprint=WRITTEN_FINGERPRINT)


def test_a_record_says_its_format_and_holds_every_key_of_it(tmp_path):
    cell = record_cell(tmp_path)
    write_fingerprint(cell, cell.fingerprint, commit='abc')
    record = json.loads((tmp_path / 'v' / 'lr0.001' / 'seed0' / FINGERPRINT_FILE).read_text())
    assert RECORD_FORMAT == 2 and record == {
        FORMAT_KEY: 2, 'variant': 'v', 'config_file': BASELINE, 'commit': 'abc', 'wall_s': None, 'cpu': None,
        'checkpoint_sha256': None, **WRITTEN_FINGERPRINT}
    assert cell_record(cell) == record


def test_a_format_1_record_reads_its_missing_keys_as_not_known_and_its_hooks_by_their_registered_names(tmp_path):
    cell = record_cell(tmp_path)
    path = tmp_path / 'v' / 'lr0.001' / 'seed0' / FINGERPRINT_FILE
    path.parent.mkdir(parents=True)
    written = [dict(type='AttentionConditioningHook', interval=25), dict(type='TrainingDynamicsHook', interval=10)]
    format_1 = dict(WRITTEN_FINGERPRINT, variant='v', config_file=BASELINE, config=dict(custom_hooks=written))
    del format_1['inputs']
    path.write_text(json.dumps(format_1))
    hooks = [dict(type='AttentionKappaHook', interval=25), dict(type='TrainingDynamicsHook', interval=10)]
    assert cell_record(cell) == dict(format_1, record_format=1, inputs=None, commit=None, wall_s=None, cpu=None,
                                     checkpoint_sha256=None, config=dict(custom_hooks=hooks))
    assert recorded_fingerprint(cell) == dict(WRITTEN_FINGERPRINT, inputs=None, config=dict(custom_hooks=hooks))
    # format 2 keeps a hook's name as written: such a record was resolved from a config that names it so
    write_fingerprint(cell, dict(WRITTEN_FINGERPRINT, config=dict(custom_hooks=written)))
    assert cell_record(cell)['config'] == dict(custom_hooks=written)


@pytest.mark.parametrize('change, message', [
    ({FORMAT_KEY: 3}, 'is a record of format 3; this condtok_mm reads formats 1 to 2: gather the cell with the '
                      'condtok_mm that wrote it'),
    ({FORMAT_KEY: '2'}, "is a record of format '2'; this condtok_mm reads formats 1 to 2"),
    ({FORMAT_KEY: True}, 'is a record of format True; this condtok_mm reads formats 1 to 2'),
    ({'cpu': 'drop', 'inputs': 'drop'}, 'is a record of format 2 without inputs, cpu: set the cell aside')])
def test_a_record_of_a_format_not_read_or_without_a_key_of_its_format_is_refused_naming_it(change, message,
                                                                                           tmp_path):
    cell = record_cell(tmp_path)
    write_fingerprint(cell, cell.fingerprint)
    path = tmp_path / 'v' / 'lr0.001' / 'seed0' / FINGERPRINT_FILE
    record = json.loads(path.read_text())
    record.update({key: value for key, value in change.items() if value != 'drop'})
    path.write_text(json.dumps({key: value for key, value in record.items() if change.get(key) != 'drop'}))
    with pytest.raises(UnreadableCellFile, match=re.escape(f'{path} {message}')):
        cell_record(cell)
