"""A training run killed (SIGKILL) in the middle of an epoch and resumed with --resume ends exactly as an
uninterrupted run: same weights to the bit, same AP."""
import os.path as osp
import re
import signal
import subprocess
import sys

import pytest
import torch

from conftest import DEMO, REPO_ROOT, data_options, run_tool


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
    log = []
    for line in run.stdout:  # the log, line by line
        log.append(line)
        if re.search(r'Epoch\(train\) \[2\]\[1/2\]', line):  # epoch 2 is in progress
            run.send_signal(signal.SIGKILL)
            break
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
