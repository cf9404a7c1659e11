"""condtok_mm.compat.cpu_launchers: --launcher pytorch/slurm without a GPU, and mmengine's code with one.

The multi-process runs of the real tools are in test_distributed.py; here one process runs each launcher in a
one-process gloo group.
"""
import os
import os.path as osp

import pytest
import torch.distributed as torch_dist
import torch.multiprocessing as mp
from mmengine.config import Config
from mmengine.dist import init_dist
from mmengine.model import MMDistributedDataParallel
from mmengine.runner import Runner
from torch import nn

from condtok_mm import compat
from condtok_mm.compat import cpu_launchers
from helpers.processes import free_port
from helpers.repo import REPO_ROOT
from helpers.toy_runner import toy_cfg

# The tests below run the fixes in this process (the opt-in our tools and configs make); the tests of what a
# bare import leaves alone run in fresh processes (test_opt_in.py).
compat.apply()


@pytest.fixture
def cpu_only(monkeypatch):
    """The machine as compat sees it: no GPU (also where the tests run on a GPU machine)."""
    monkeypatch.setattr(cpu_launchers, 'runs_on_cpu', lambda: True)  # where the launchers look it up


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
    monkeypatch.setattr(cpu_launchers, 'runs_on_cpu', lambda: False)
    calls = []
    monkeypatch.setattr(cpu_launchers, '_upstream_init_dist_pytorch',
                        lambda *args, **kwargs: calls.append(('pytorch', args, kwargs)))
    monkeypatch.setattr(cpu_launchers, '_upstream_init_dist_slurm',
                        lambda *args, **kwargs: calls.append(('slurm', args, kwargs)))
    monkeypatch.setattr(cpu_launchers, '_upstream_wrap_model',
                        lambda runner, cfg, model: calls.append(('wrap', cfg)))
    init_dist('pytorch')
    init_dist('slurm', port=1234)
    cpu_launchers._wrap_model(Config(dict(distributed=True, cfg={})), None, nn.Linear(1, 1))
    assert calls == [('pytorch', ('nccl', ), dict(init_backend='torch')),
                     ('slurm', ('nccl', ), dict(port=1234, init_backend='torch')), ('wrap', None)]
