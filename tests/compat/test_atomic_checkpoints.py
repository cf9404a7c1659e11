"""condtok_mm.compat.atomic_checkpoints: a kill while a checkpoint is written leaves a loadable latest one.

The kills of real training runs are in test_interruption.py.
"""
import os.path as osp
import subprocess
import sys

import pytest
import torch
from mmengine.runner import Runner, find_latest_checkpoint

from condtok_mm import compat
from helpers.processes import read_until
from helpers.repo import REPO_ROOT
from helpers.toy_runner import toy_cfg

# The tests below run the fixes in this process (the opt-in our tools and configs make); the tests of what a
# bare import leaves alone run in fresh processes (test_opt_in.py).
compat.apply()


@pytest.mark.slow  # a fresh Python process (~10 s of imports on 2 cores)
def test_a_checkpoint_killed_while_written_leaves_the_previous_one(tmp_path):
    # The child saves epoch_1.pth, then saves it again with every file opened for writing in tmp_path
    # writing half of the data and waiting to be killed, wherever in the save the file is written.
    path = str(tmp_path / 'epoch_1.pth')
    child = subprocess.Popen([sys.executable, '-c', f'''
import builtins, sys, time
sys.path.insert(0, {REPO_ROOT!r})
import condtok_mm.compat.enable
from mmengine.runner import save_checkpoint
save_checkpoint({{'step': 1}}, {path!r})

class HalfWriter:
    def __init__(self, file):
        self.file = file
    def write(self, data):
        self.file.write(bytes(data)[:len(data) // 2])
        self.file.flush()
        print('writing', flush=True)
        time.sleep(600)
    def __getattr__(self, name):
        return getattr(self.file, name)
    def __enter__(self):
        return self
    def __exit__(self, *exc_info):
        self.file.close()

real_open = builtins.open
def open_half_writing(file, mode='r', *args, **kwargs):
    opened = real_open(file, mode, *args, **kwargs)
    return HalfWriter(opened) if 'w' in mode and str(file).startswith({str(tmp_path)!r}) else opened
builtins.open = open_half_writing
save_checkpoint({{'step': 2}}, {path!r})
'''], stdout=subprocess.PIPE, text=True)
    read_until(child, r'^writing$', timeout=120)
    child.kill()  # SIGKILL
    child.wait()
    assert torch.load(path, weights_only=False) == {'step': 1}


def test_checkpoint_hook_deletes_the_oldest_checkpoint_only_after_saving_the_next(tmp_path, monkeypatch):
    # With max_keep_ckpts=1, mmengine deletes epoch_1.pth before it writes epoch_2.pth: a run killed in
    # between has no checkpoint left, and last_checkpoint names a deleted file.
    Runner.from_cfg(toy_cfg(tmp_path, train_cfg=dict(max_epochs=1),
                            default_hooks=dict(checkpoint=dict(max_keep_ckpts=1)))).train()

    def killed(obj, f):
        raise RuntimeError('killed while saving')

    monkeypatch.setattr(torch, 'save', killed)
    runner = Runner.from_cfg(toy_cfg(tmp_path, train_cfg=dict(max_epochs=2), resume=True,
                                     default_hooks=dict(checkpoint=dict(max_keep_ckpts=1))))
    with pytest.raises(RuntimeError, match='killed while saving'):
        runner.train()
    assert find_latest_checkpoint(str(tmp_path)) == osp.join(str(tmp_path), 'epoch_1.pth')
    assert torch.load(tmp_path / 'epoch_1.pth', weights_only=False)['meta']['epoch'] == 1
    assert sorted(p.name for p in tmp_path.glob('*.pth')) == ['epoch_1.pth']

    monkeypatch.undo()
    Runner.from_cfg(toy_cfg(tmp_path, train_cfg=dict(max_epochs=2), resume=True,
                            default_hooks=dict(checkpoint=dict(max_keep_ckpts=1)))).train()
    assert sorted(p.name for p in tmp_path.glob('*.pth')) == ['epoch_2.pth']
    assert find_latest_checkpoint(str(tmp_path)) == osp.join(str(tmp_path), 'epoch_2.pth')
