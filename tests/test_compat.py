"""condtok_mm.compat: distributed runs without a GPU, checkpoints that survive a kill, resuming exactly.

The multi-process runs of the real tools are in test_distributed.py and test_interruption.py; here each fix is
run in this process on a toy model, with a one-process gloo group where a process group is needed.
"""
import os
import os.path as osp
import random
import subprocess
import sys
import uuid

import numpy as np
import pytest
import torch
import torch.distributed as torch_dist
import torch.multiprocessing as mp
from mmengine.config import Config
from mmengine.dist import init_dist
from mmengine.evaluator import BaseMetric
from mmengine.hooks import Hook
from mmengine.model import BaseModel, MMDistributedDataParallel
from mmengine.registry import DATASETS, HOOKS, METRICS, MODELS
from mmengine.runner import Runner, find_latest_checkpoint
from torch import nn
from torch.utils.data import Dataset

from condtok_mm import compat
from conftest import REPO_ROOT, free_port, read_until


@MODELS.register_module(force=True)
class DropoutRegressor(BaseModel):
    """A toy model that draws from torch's random generator when it trains (dropout)."""

    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(2, 8), nn.Dropout(0.5), nn.Linear(8, 1))

    def forward(self, inputs, data_samples=None, mode='tensor'):
        outputs = self.layers(torch.stack(inputs)).squeeze(1)
        if mode == 'loss':
            return dict(loss=((outputs - torch.stack(data_samples))**2).mean())
        return outputs


@DATASETS.register_module(force=True)
class JitteredPoints(Dataset):
    """A toy dataset that draws from numpy's and Python's random generators for each item (augmentation)."""
    metainfo = {}

    def __len__(self):
        return 12

    def __getitem__(self, index):
        point = np.array([index / 12, 1.0]) + np.random.normal(0, 0.1, size=2)
        if random.random() < 0.5:
            point = point[::-1].copy()
        return dict(inputs=torch.tensor(point, dtype=torch.float32),
                    data_samples=torch.tensor(index % 3, dtype=torch.float32))


@METRICS.register_module(force=True)
class MeanPrediction(BaseMetric):

    def process(self, data_batch, data_samples):
        self.results.extend(float(x) for x in data_samples)

    def compute_metrics(self, results):
        return dict(mean=float(np.mean(results)))


@HOOKS.register_module(force=True)
class CrashInEpoch(Hook):
    """Stands for a kill: raises before the given iteration of the given (0-based) epoch."""

    def __init__(self, epoch, batch_idx):
        self.epoch, self.batch_idx = epoch, batch_idx

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        if (runner.epoch, batch_idx) == (self.epoch, self.batch_idx):
            raise RuntimeError('crash')


def toy_cfg(work_dir, **options):
    cfg = Config(
        dict(
            work_dir=str(work_dir),
            experiment_name=f'toy_{uuid.uuid4().hex}',  # runners built in the same second differ
            model=dict(type='DropoutRegressor'),
            train_dataloader=dict(dataset=dict(type='JitteredPoints'), batch_size=3, num_workers=0,
                                  sampler=dict(type='DefaultSampler', shuffle=True)),
            val_dataloader=dict(dataset=dict(type='JitteredPoints'), batch_size=3, num_workers=0,
                                sampler=dict(type='DefaultSampler', shuffle=False)),
            val_evaluator=dict(type='MeanPrediction'),
            val_cfg=dict(),
            optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.05)),
            train_cfg=dict(by_epoch=True, max_epochs=3, val_interval=1),
            default_hooks=dict(checkpoint=dict(type='CheckpointHook', interval=1)),
            randomness=dict(seed=0, deterministic=True)))
    cfg.merge_from_dict(options)
    return cfg


@pytest.fixture
def cpu_only(monkeypatch):
    """The machine as compat sees it: no GPU (also where the tests run on a GPU machine)."""
    monkeypatch.setattr(compat, 'runs_on_cpu', lambda: True)


@pytest.fixture
def dist_env(monkeypatch):
    """Clean torch.distributed variables, and no process group or start method left behind."""
    for name in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'MASTER_ADDR', 'MASTER_PORT', 'SLURM_PROCID',
                 'SLURM_NTASKS', 'SLURM_NODELIST', 'SLURM_LOCALID'):
        monkeypatch.delenv(name, raising=False)
    start_method = mp.get_start_method(allow_none=True)  # init_dist sets 'spawn' when none is set
    yield monkeypatch
    if torch_dist.is_initialized():
        torch_dist.destroy_process_group()
    mp.set_start_method(start_method, force=True)


@pytest.fixture
def torchrun_env(dist_env):
    """The variables torchrun gives the one process of a one-process job."""
    for name, value in dict(RANK='0', WORLD_SIZE='1', LOCAL_RANK='0', MASTER_ADDR='127.0.0.1',
                            MASTER_PORT=str(free_port())).items():
        dist_env.setenv(name, value)


def test_torchrun_launcher_without_gpu_trains_with_gloo_and_cpu_ddp(tmp_path, cpu_only, torchrun_env):
    # mmengine's default env_cfg asks for nccl
    runner = Runner.from_cfg(toy_cfg(tmp_path, launcher='pytorch', train_cfg=dict(max_epochs=1)))
    assert torch_dist.get_backend() == 'gloo'
    runner.train()
    assert isinstance(runner.model, MMDistributedDataParallel) and runner.model.device_ids is None


def test_an_explicit_model_wrapper_cfg_keeps_its_settings_on_cpu(tmp_path, cpu_only, torchrun_env):
    runner = Runner.from_cfg(
        toy_cfg(tmp_path, launcher='pytorch', model_wrapper_cfg=dict(find_unused_parameters=True)))
    assert isinstance(runner.model, MMDistributedDataParallel)
    assert runner.model.device_ids is None and runner.model.find_unused_parameters


FAKE_SLURM = osp.join(REPO_ROOT, 'tests', 'fake_slurm')  # srun and scontrol stand-ins for one machine


def test_slurm_launcher_without_gpu_takes_rank_and_master_from_srun(tmp_path, cpu_only, dist_env):
    for name, value in dict(SLURM_PROCID='0', SLURM_NTASKS='1', SLURM_LOCALID='0',
                            SLURM_NODELIST='node[01-02]').items():
        dist_env.setenv(name, value)
    dist_env.setenv('PATH', FAKE_SLURM + os.pathsep + os.environ['PATH'])  # its scontrol answers 127.0.0.1
    dist_env.setenv('FAKE_SCONTROL_ARGS', str(tmp_path / 'scontrol_args'))
    port = free_port()
    init_dist('slurm', backend='nccl', port=port)  # what Runner does with env_cfg.dist_cfg
    assert torch_dist.get_backend() == 'gloo' and torch_dist.get_world_size() == 1
    assert (tmp_path / 'scontrol_args').read_text() == 'show hostname node[01-02]\n'
    assert {name: os.environ[name] for name in ('MASTER_ADDR', 'MASTER_PORT', 'WORLD_SIZE', 'RANK',
                                                'LOCAL_RANK')} == dict(MASTER_ADDR='127.0.0.1',
                                                                       MASTER_PORT=str(port),
                                                                       WORLD_SIZE='1', RANK='0',
                                                                       LOCAL_RANK='0')


def test_slurm_launcher_outside_srun_says_how_to_start_the_job(cpu_only, dist_env):
    with pytest.raises(RuntimeError, match='needs SLURM_PROCID, SLURM_NTASKS, SLURM_NODELIST, '
                       'SLURM_LOCALID.*tools/slurm_train.sh'):
        init_dist('slurm')


def test_slurm_launcher_without_scontrol_asks_for_master_addr(tmp_path, cpu_only, dist_env):
    for name, value in dict(SLURM_PROCID='0', SLURM_NTASKS='1', SLURM_LOCALID='0',
                            SLURM_NODELIST='node01').items():
        dist_env.setenv(name, value)
    dist_env.setenv('PATH', str(tmp_path))  # no scontrol there
    with pytest.raises(RuntimeError, match="master node of SLURM_NODELIST='node01'.*Set MASTER_ADDR"):
        init_dist('slurm')


def test_torchrun_launcher_outside_torchrun_says_how_to_start_the_job(dist_env):
    with pytest.raises(RuntimeError,
                       match='needs RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT.*tools/dist_train.sh'):
        init_dist('pytorch')


def test_a_gpu_only_init_backend_without_gpu_gets_a_clear_error(cpu_only, torchrun_env):
    with pytest.raises(ValueError, match="init_backend='deepspeed' needs a GPU.*'torch'"):
        init_dist('pytorch', init_backend='deepspeed')


def test_with_a_gpu_mmengine_launches_and_wraps_as_before(monkeypatch, torchrun_env):
    monkeypatch.setattr(compat, 'runs_on_cpu', lambda: False)
    calls = []
    monkeypatch.setattr(compat, '_upstream_init_dist_pytorch',
                        lambda *args, **kwargs: calls.append(('pytorch', args, kwargs)))
    monkeypatch.setattr(compat, '_upstream_init_dist_slurm',
                        lambda *args, **kwargs: calls.append(('slurm', args, kwargs)))
    monkeypatch.setattr(compat, '_upstream_wrap_model',
                        lambda runner, cfg, model: calls.append(('wrap', cfg)))
    init_dist('pytorch')
    init_dist('slurm', port=1234)
    compat._wrap_model(Config(dict(distributed=True, cfg={})), None, nn.Linear(1, 1))
    assert calls == [('pytorch', ('nccl', ), dict(init_backend='torch')),
                     ('slurm', ('nccl', ), dict(port=1234, init_backend='torch')), ('wrap', None)]


def test_a_checkpoint_killed_while_written_leaves_the_previous_one(tmp_path):
    # The child saves epoch_1.pth, then saves it again with every file opened for writing in tmp_path
    # writing half of the data and waiting to be killed, wherever in the save the file is written.
    path = str(tmp_path / 'epoch_1.pth')
    child = subprocess.Popen([sys.executable, '-c', f'''
import builtins, sys, time
sys.path.insert(0, {REPO_ROOT!r})
import condtok_mm
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


def test_a_resumed_run_draws_the_random_numbers_of_the_uninterrupted_run(tmp_path):
    # The toy run draws from torch (dropout, DataLoader seeds), numpy and Python (augmentation), and
    # validates after every epoch.
    uninterrupted = Runner.from_cfg(toy_cfg(tmp_path / 'uninterrupted'))
    uninterrupted.train()

    crashed = Runner.from_cfg(toy_cfg(tmp_path / 'resumed', custom_hooks=[dict(type='CrashInEpoch', epoch=1,
                                                                               batch_idx=2)]))
    with pytest.raises(RuntimeError, match='crash'):
        crashed.train()
    assert crashed.epoch == 1 and crashed.iter == 6
    resumed = Runner.from_cfg(toy_cfg(tmp_path / 'resumed', resume=True))
    resumed.train()

    expected = uninterrupted.model.state_dict()
    for name, tensor in resumed.model.state_dict().items():
        assert torch.equal(tensor, expected[name]), name
    assert resumed.message_hub.get_scalar('val/mean').current() == \
        uninterrupted.message_hub.get_scalar('val/mean').current()
