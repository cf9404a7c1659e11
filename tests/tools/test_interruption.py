"""A training run killed (SIGKILL) in the middle of an epoch and resumed with --resume ends exactly as an
uninterrupted run: same weights to the bit, same AP; in one process and in two (torchrun, gloo)."""
import os
import os.path as osp
import re
import signal
import subprocess
import sys
import time

import pytest
import torch
from mmengine.config import Config

from helpers.cfg_options import data_options
from helpers.processes import alive, free_port, process_tree, read_until
from helpers.repo import DEMO, REPO_ROOT, run_tool


@pytest.mark.slow
def test_a_run_killed_mid_epoch_and_resumed_ends_as_if_never_killed(shapes_root, trained_checkpoint,
                                                                    tmp_path):
    # Fine-tune the trained demo model (so that AP is not 0) for 3 epochs of 2 iterations, validating after
    # each epoch; deterministic CPU settings, data loaded in the main process, a checkpoint after every epoch.
    options = ['--cfg-options', *data_options(shapes_root, 3), 'train_cfg.val_interval=1',
               'train_dataloader.dataset.indices=8', 'randomness.deterministic=True',
               f'load_from={trained_checkpoint}']
    uninterrupted = run_tool('train.py', DEMO, '--work-dir', str(tmp_path / 'uninterrupted'), *options)

    work_dir = tmp_path / 'resumed'
    run = subprocess.Popen([sys.executable, osp.join(REPO_ROOT, 'tools', 'train.py'), DEMO, '--work-dir',
                            str(work_dir), *options], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, cwd=REPO_ROOT)
    log = read_until(run, r'Epoch\(train\) \[2\]\[1/2\]', timeout=600)  # epoch 2 is in progress
    run.send_signal(signal.SIGKILL)
    assert run.wait() == -signal.SIGKILL, ''.join(log[-50:])
    assert sorted(p.name for p in work_dir.glob('*.pth')) == ['epoch_1.pth']

    resumed = run_tool('train.py', DEMO, '--work-dir', str(work_dir), '--resume', *options)
    assert 'resumed epoch: 1, iter: 2' in resumed
    assert 'Epoch(train) [2][1/2]' in resumed and 'Epoch(train) [1]' not in resumed

    expected = torch.load(tmp_path / 'uninterrupted' / 'epoch_3.pth', weights_only=False)['state_dict']
    weights = torch.load(work_dir / 'epoch_3.pth', weights_only=False)['state_dict']
    assert weights.keys() == expected.keys()
    for name, tensor in weights.items():
        assert torch.equal(tensor, expected[name]), name
    ap_lines = re.compile(r'(?:bbox|segm)_mAP_copypaste: .*')
    assert ap_lines.findall(resumed)[-2:] == ap_lines.findall(uninterrupted)[-2:]  # after epoch 3
    assert ap_lines.findall(resumed)[:2] == ap_lines.findall(uninterrupted)[2:4]  # after epoch 2
    assert float(ap_lines.findall(resumed)[-2].split()[1]) > 0  # bbox mAP


def two_process_config(tmp_path):
    """The demo config, plus a hook that writes each rank's final weights (only rank 0 writes checkpoints)."""
    path = tmp_path / 'demo_rank_weights.py'
    hooks = [*Config.fromfile(DEMO).to_dict().get('custom_hooks', []), dict(type='SaveRankWeights')]
    imports = ['condtok_mm', 'condtok_mm.compat.enable', 'rank_weights']
    path.write_text(f"_base_ = {DEMO!r}\ncustom_imports = dict(imports={imports!r}, allow_failed_imports=False)\n"
                    f"custom_hooks = {hooks!r}\n")
    return str(path)


def dist_train(config, work_dir, options):
    """tools/dist_train.sh with 2 processes on the CPU (gloo)."""
    env = {**os.environ, 'PYTHON': sys.executable, 'CUDA_VISIBLE_DEVICES': '', 'OMP_NUM_THREADS': '1',
           'PORT': str(free_port()),
           'PYTHONPATH': os.pathsep.join([osp.join(REPO_ROOT, 'tests', 'helpers'), os.environ.get('PYTHONPATH', '')])}
    return subprocess.Popen(['bash', osp.join(REPO_ROOT, 'tools', 'dist_train.sh'), config, '2', '--work-dir',
                             str(work_dir), *options], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=REPO_ROOT, env=env)


def kill_tree(run):
    """SIGKILL the launcher and every rank at once, as when the machine fails; wait until none runs. (torchrun
    starts each rank in a session of its own, so killing the launcher's process group would spare the ranks.)"""
    tree = process_tree(run.pid)
    for pid in tree:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert run.wait(timeout=60) == -signal.SIGKILL
    deadline = time.monotonic() + 60
    while any(alive(pid) for pid in tree) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not any(alive(pid) for pid in tree)
    return len(tree)


def finish(run, timeout=900):
    log, _ = run.communicate(timeout=timeout)
    assert run.returncode == 0, log[-5000:]
    return log


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_two_processes_killed_mid_epoch_and_resumed_end_as_if_never_killed(shapes_root, trained_checkpoint,
                                                                           tmp_path):
    # 2 processes x 2 images per batch x 2 iterations = the 8 images of an epoch; validation after each epoch
    config = two_process_config(tmp_path)
    options = ['--cfg-options', *data_options(shapes_root, 3), 'train_cfg.val_interval=1',
               'train_dataloader.dataset.indices=8', 'train_dataloader.batch_size=2',
               'randomness.deterministic=True', f'load_from={trained_checkpoint}']
    uninterrupted = finish(dist_train(config, tmp_path / 'uninterrupted', options))

    work_dir = tmp_path / 'resumed'
    run = dist_train(config, work_dir, options)
    read_until(run, r'Epoch\(train\) \[2\]\[1/2\]', timeout=900)  # epoch 2 is in progress
    assert kill_tree(run) >= 4  # bash, torchrun and the two ranks
    assert sorted(p.name for p in work_dir.glob('*.pth')) == ['epoch_1.pth']

    resumed = finish(dist_train(config, work_dir, ['--resume', *options]))
    assert 'resumed epoch: 1, iter: 2' in resumed
    assert 'Epoch(train) [2][1/2]' in resumed and 'Epoch(train) [1]' not in resumed

    expected = torch.load(tmp_path / 'uninterrupted' / 'epoch_3.pth', weights_only=False)['state_dict']
    for run_dir in (tmp_path / 'uninterrupted', work_dir):
        checkpoint = torch.load(run_dir / 'epoch_3.pth', weights_only=False)['state_dict']
        for rank in (0, 1):
            weights = torch.load(run_dir / f'rank{rank}_weights.pth', weights_only=False)
            assert weights.keys() == expected.keys() == checkpoint.keys()
            for name, tensor in weights.items():
                assert torch.equal(tensor, expected[name]) and torch.equal(tensor, checkpoint[name]), \
                    (run_dir.name, rank, name)
    ap_lines = re.compile(r'(?:bbox|segm)_mAP_copypaste: .*')
    assert ap_lines.findall(resumed)[-2:] == ap_lines.findall(uninterrupted)[-2:]  # after epoch 3
    assert ap_lines.findall(resumed)[:2] == ap_lines.findall(uninterrupted)[2:4]  # after epoch 2
    assert float(ap_lines.findall(resumed)[-2].split()[1]) > 0  # bbox mAP
