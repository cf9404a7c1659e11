"""condtok_mm.compat: opt-in only; distributed runs without a GPU, checkpoints that survive a kill, resuming exactly.

The multi-process runs of the real tools are in test_distributed.py and test_interruption.py; here each fix is
run in this process on a toy model, with a one-process gloo group where a process group is needed.
"""
import contextlib
import functools
import importlib
import http.server
import json
import os
import os.path as osp
import random
import re
import subprocess
import sys
import shutil
import textwrap
import threading
import time
import uuid

import numpy as np
import pytest
import torch
import torch.distributed as torch_dist
import torch.multiprocessing as mp
from mmengine.config import Config
from mmengine.dist import init_dist
from mmengine.evaluator import BaseMetric
from mmengine.fileio import io as fileio_io
from mmengine.hooks import Hook
from mmengine.logging import HistoryBuffer
from mmengine.model import BaseModel, BaseModule, MMDistributedDataParallel
from mmengine.registry import DATASETS, HOOKS, METRICS, MODELS
from mmengine.runner import Runner, find_latest_checkpoint, load_checkpoint
from mmengine.runner import checkpoint as checkpoint_module
from torch import nn
from torch.utils.data import Dataset

from condtok_mm import compat
from condtok_mm.compat import cpu_launchers
from conftest import DEMO, REPO_ROOT, data_options, free_port, read_until

# The tests below run the fixes in this process (the opt-in our tools and configs make); the tests of what a
# bare import leaves alone run in fresh processes.
compat.apply()

# Records every attribute of every loaded module of the stack (and of each class defined there), then runs
# STEP, then prints, as JSON, every recorded attribute that is now another object or gone. Modules that
# condtok_mm imports are loaded before the record, so that only what the step changes in them shows.
SIDE_EFFECTS_SCRIPT = """
import json, sys
sys.path.insert(0, {repo!r})
import mmengine.runner, mmengine.dist, mmengine.hooks, mmdet.models, mmdet.datasets, mmdet.evaluation
import mmdet.engine, mmpretrain.models, torch.serialization
from mmengine.runner.checkpoint import CheckpointLoader
{before}

STACK = ('torch', 'mmengine', 'mmdet', 'mmcv', 'mmpretrain', 'numpy', 'pycocotools', 'faster_coco_eval')

def record():
    state = {{}}
    for name, module in list(sys.modules.items()):
        if module is None or not name.split('.')[0] in STACK:
            continue
        for attr, value in list(vars(module).items()):
            state[f'{{name}}.{{attr}}'] = id(value)
            if isinstance(value, type) and value.__module__ == name:
                for class_attr, class_value in list(vars(value).items()):
                    state[f'{{name}}.{{attr}}.{{class_attr}}'] = id(class_value)
    for prefix, loader in CheckpointLoader._schemes.items():
        state[f'CheckpointLoader._schemes[{{prefix!r}}]'] = id(loader)
    for safe_global in torch.serialization.get_safe_globals():
        state[f'torch.serialization safe global {{safe_global!r}}'] = id(safe_global)
    return state

before = record()
{step}
after = record()
print(json.dumps(sorted(key for key, value in before.items() if after.get(key) != value)))
"""


def side_effects(step, before=''):
    """The names of the stack's functions, classes' attributes, checkpoint schemes and torch safe globals that
    are other objects after ``step`` (Python source) has run in a fresh process."""
    result = subprocess.run([sys.executable, '-c', SIDE_EFFECTS_SCRIPT.format(repo=REPO_ROOT, before=before,
                                                                            step=textwrap.dedent(step))],
                            capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.splitlines()[-1])


PATCHED_BY_THE_FIXES = [
    "CheckpointLoader._schemes['']", "CheckpointLoader._schemes['(\\\\S+\\\\:)?petrel://']",
    "CheckpointLoader._schemes['(\\\\S+\\\\:)?s3://']", "CheckpointLoader._schemes['http://']",
    "CheckpointLoader._schemes['https://']", "CheckpointLoader._schemes['open-mmlab://']",
    "CheckpointLoader._schemes['openmmlab://']", "CheckpointLoader._schemes['pavi://']",
    'mmengine._strategy.colossalai.save_checkpoint', 'mmengine._strategy.deepspeed.save_checkpoint',
    'mmengine.dist.utils._init_dist_pytorch', 'mmengine.dist.utils._init_dist_slurm',
    'mmengine.hooks.checkpoint_hook.CheckpointHook._save_checkpoint_with_step',
    'mmengine.runner.checkpoint.CheckpointLoader._schemes',  # register_scheme sorts the schemes into a new dict
    'mmengine.runner.checkpoint.load_from_http',  # called by name by the torchvision:// and mmcls:// loaders
    'mmengine.runner.checkpoint.save_checkpoint', 'mmengine.runner.loops.ValLoop.run',
    'mmengine.runner.runner.Runner.resume', 'mmengine.runner.runner.Runner.save_checkpoint',
    'mmengine.runner.runner.Runner.scale_lr', 'mmengine.runner.runner.Runner.wrap_model',
    'mmengine.runner.runner.save_checkpoint', 'mmengine.runner.save_checkpoint']


@pytest.mark.slow  # a fresh Python process (~10 s of imports on 2 cores)
def test_opting_in_changes_what_the_fixes_list():
    # the check below sees a change where there is one
    assert side_effects('import condtok_mm.compat.enable') == PATCHED_BY_THE_FIXES


@pytest.mark.slow  # a fresh Python process (~10 s of imports on 2 cores)
@pytest.mark.parametrize('step', [
    'import condtok_mm',
    """
    from mmengine.config import Config
    Config.fromfile({host_config!r})  # imports custom_imports
    """])
def test_importing_condtok_mm_changes_nothing_outside_its_registries(step, tmp_path):
    host_config = tmp_path / 'host_config.py'  # a host project's config that uses our backbone
    host_config.write_text("custom_imports = dict(imports=['condtok_mm'], allow_failed_imports=False)\n"
                           "model = dict(backbone=dict(type='CondSwinTransformer'))\n")
    assert side_effects(step.format(host_config=str(host_config))) == []


@pytest.mark.slow  # a fresh Python process (~10 s of imports on 2 cores)
def test_no_fix_applies_to_an_mmengine_newer_than_the_last_one_with_the_bugs():
    # a newer mmengine may have fixed any of these bugs (none is released yet), so each fix stands aside
    assert side_effects("""
        from condtok_mm import compat
        assert compat.apply() == (), compat.apply()
        """, before="mmengine.__version__ = '0.10.8'") == []


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


class RunsACommand:
    """What a malicious .pth holds: unpickling it runs a shell command."""

    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command, )


def save_a_checkpoint_that_runs(command, path, legacy_format=False):
    torch.save({'state_dict': nn.Linear(2, 1).state_dict(), 'meta': {'note': RunsACommand(command)}}, path,
               _use_new_zipfile_serialization=not legacy_format)


@pytest.mark.parametrize('legacy_format', [False, True], ids=['zip', 'legacy'])
def test_a_checkpoint_whose_pickle_would_run_a_command_is_refused_and_the_command_never_runs(
        tmp_path, legacy_format):
    marker = tmp_path / 'the_command_ran'
    path = str(tmp_path / 'epoch_1.pth')
    save_a_checkpoint_that_runs(f'touch {marker}', path, legacy_format)
    with pytest.raises(compat.UnsafeCheckpointError,
                       match=f'Refusing to load the checkpoint {re.escape(path)}: it holds posix.system, '):
        load_checkpoint(nn.Linear(2, 1), path)  # what load_from, --resume and tools/test.py call
    assert not marker.exists()


class ReachesIntoHistoryBuffer:
    """A pickle that uses the getattr HistoryBuffer's own pickles need to reach its class-level registry."""

    def __reduce__(self):
        return getattr, (HistoryBuffer, '_statistics_methods')


def test_the_getattr_of_history_buffer_pickles_reaches_nothing_else(tmp_path):
    path = str(tmp_path / 'epoch_1.pth')
    torch.save({'meta': {'note': ReachesIntoHistoryBuffer()}}, path)
    with pytest.raises(compat.UnsafeCheckpointError,
                       match=f"checkpoint {re.escape(path)}: it holds getattr\\(<class "
                       "'mmengine.logging.history_buffer.HistoryBuffer'>, '_statistics_methods'\\), "):
        load_checkpoint(nn.Linear(2, 1), path)


def test_runner_checkpoints_hold_exactly_the_allowed_types_and_load(tmp_path):
    Runner.from_cfg(toy_cfg(tmp_path / 'trained', train_cfg=dict(max_epochs=1))).train()
    path = str(tmp_path / 'trained' / 'epoch_1.pth')
    allowed = {name if isinstance(name, str) else f'{name.__module__}.{name.__name__}'
               for name in (entry[1] if isinstance(entry, tuple) else entry
                            for entry in compat.checkpoint_safe_globals())}
    held = set(torch.serialization.get_unsafe_globals_in_checkpoint(path))  # outside torch's own allow-list
    # the message hub's buffers (with their statistics methods), numpy arrays and scalars, random states
    # (the dtype classes are built, not named, so they are not listed: loading below needs them)
    assert {'mmengine.logging.history_buffer.HistoryBuffer', 'builtins.getattr', 'numpy.ndarray',
            'numpy.dtype'} <= held <= allowed
    assert all(name.startswith('numpy.') for name in allowed - held)

    runner = Runner.from_cfg(toy_cfg(tmp_path / 'fine-tuned', load_from=path, train_cfg=dict(max_epochs=1)))
    runner.load_or_resume()
    trained = torch.load(path, weights_only=False)['state_dict']
    for name, tensor in runner.model.state_dict().items():
        assert torch.equal(tensor, trained[name]), name


@pytest.mark.slow  # a fresh Python process (~10 s of imports on 2 cores)
@pytest.mark.parametrize('source', ['file', 'url'])
def test_tools_test_refuses_a_checkpoint_that_would_run_a_command(source, shapes_root, tmp_path, caches, served):
    directory, url = served
    marker = tmp_path / 'the_command_ran'
    path = str(directory / 'epoch_12.pth')
    save_a_checkpoint_that_runs(f'touch {marker}', path)
    checkpoint = dict(file=path, url=f'{url}/epoch_12.pth')[source]
    result = subprocess.run([sys.executable, osp.join(REPO_ROOT, 'tools', 'test.py'), DEMO, checkpoint,
                             '--work-dir', str(tmp_path / 'test'), '--cfg-options',
                             *data_options(shapes_root, 1)],
                            capture_output=True, text=True, timeout=600, cwd=REPO_ROOT)
    assert result.returncode == 1, result.stderr[-3000:]
    assert f'error: Refusing to load the checkpoint {checkpoint}' in result.stderr, result.stderr[-3000:]
    assert ': it holds posix.system, ' in result.stderr
    assert 'Traceback' not in result.stderr
    assert not marker.exists()

def test_apply_applies_every_fix_of_the_table_in_its_order():
    assert [fix.name for fix in compat.FIXES] == ['checkpoint_loading', 'cpu_launchers', 'auto_scale_lr',
                                                  'atomic_checkpoints', 'exact_resume']
    assert compat.apply() == tuple(fix.name for fix in compat.FIXES)  # this mmengine has every bug


def test_auto_scale_lr_scales_the_base_lr_the_log_reports(tmp_path):
    # two parameter groups (a custom lr_mult), so that the optimizer wrapper tracks base_lr in an extra group
    runner = Runner.from_cfg(toy_cfg(tmp_path, auto_scale_lr=dict(enable=True, base_batch_size=12),
                                     optim_wrapper=dict(paramwise_cfg=dict(custom_keys={
                                         'layers.0': dict(lr_mult=0.1)}))))
    optim_wrapper = runner.build_optim_wrapper(runner.optim_wrapper)
    runner.scale_lr(optim_wrapper, runner.auto_scale_lr)  # as Runner.train does; batch size 3 of 12
    assert [group['lr'] for group in optim_wrapper.optimizer.param_groups] == pytest.approx(
        [0.05 * 0.1 / 4] * 2 + [0.05 / 4] * 2)  # layers.0's weight and bias, then layers.2's
    assert optim_wrapper.base_param_settings['lr'] == pytest.approx(0.05 / 4)


# ----------------------------------------------------------------------------------------------------------
# Checkpoints read from a URL or another mmengine scheme go through the same allow-list
# ----------------------------------------------------------------------------------------------------------
class QuietFileHandler(http.server.SimpleHTTPRequestHandler):

    def log_message(self, format, *args):
        pass


@contextlib.contextmanager
def serving(directory, max_requests=8, timeout=120):
    """The files of ``directory`` served at http://127.0.0.1:PORT/ (yields that URL) by a thread that answers
    at most ``max_requests`` requests and stops by itself after ``timeout`` seconds, or when the block ends."""
    server = http.server.HTTPServer(('127.0.0.1', 0), functools.partial(QuietFileHandler,
                                                                        directory=str(directory)))
    server.timeout = 0.2  # handle_request returns after this without a request, so the loop sees the stop
    stop = threading.Event()
    deadline = time.monotonic() + timeout

    def answer():
        answered = 0
        while answered < max_requests and not stop.is_set() and time.monotonic() < deadline:
            before = server.handled_requests
            server.handle_request()
            answered += server.handled_requests - before

    server.handled_requests = 0
    original_finish = server.finish_request

    def finish_request(request, client_address):
        server.handled_requests += 1
        original_finish(request, client_address)

    server.finish_request = finish_request
    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    try:
        yield f'http://127.0.0.1:{server.server_address[1]}'
    finally:
        stop.set()
        thread.join(timeout=10)
        server.server_close()


@pytest.fixture
def caches(tmp_path, monkeypatch):
    """torch.hub's and mmengine's download caches in tmp_path (nothing reaches the user's ~/.cache), and no
    proxy between the test and its loopback server."""
    for name in ('TORCH_HOME', 'MMENGINE_HOME', 'XDG_CACHE_HOME'):
        monkeypatch.setenv(name, str(tmp_path / 'cache' / name.lower()))
    monkeypatch.setenv('NO_PROXY', '127.0.0.1,localhost')
    monkeypatch.setenv('no_proxy', '127.0.0.1,localhost')
    monkeypatch.setattr(torch.hub, '_hub_dir', None)  # torch.hub.set_dir() not in effect
    return tmp_path / 'cache'


@pytest.fixture
def served(tmp_path):
    """A directory whose files a loopback HTTP server serves, and that server's URL."""
    directory = tmp_path / 'served'
    directory.mkdir()
    with serving(directory) as url:
        yield directory, url


class PretrainedLinear(BaseModule):
    """A module that takes its weights from ``init_cfg=dict(type='Pretrained', checkpoint=...)``."""

    def __init__(self, checkpoint):
        super().__init__(init_cfg=dict(type='Pretrained', checkpoint=checkpoint))
        self.linear = nn.Linear(2, 1)


def load_from_runner(tmp_path, checkpoint):
    runner = Runner.from_cfg(toy_cfg(tmp_path / 'load_from', load_from=checkpoint, train_cfg=dict(max_epochs=1)))
    runner.load_or_resume()  # what Runner.train/test do first
    return runner.model


def test_load_from_a_url_refuses_a_checkpoint_that_would_run_a_command(tmp_path, caches, served):
    directory, url = served
    marker = tmp_path / 'the_command_ran'
    save_a_checkpoint_that_runs(f'touch {marker}', str(directory / 'evil.pth'))
    cached = caches / 'torch_home' / 'hub' / 'checkpoints' / 'evil.pth'  # torch.hub's cache, as mmengine's
    with pytest.raises(compat.UnsafeCheckpointError, match=re.escape(
            f'Refusing to load the checkpoint {url}/evil.pth (downloaded to {cached}): it holds posix.system, ')):
        load_from_runner(tmp_path, f'{url}/evil.pth')
    assert not marker.exists()


def test_init_cfg_pretrained_from_a_url_refuses_a_checkpoint_that_would_run_a_command(tmp_path, caches, served):
    directory, url = served
    marker = tmp_path / 'the_command_ran'
    save_a_checkpoint_that_runs(f'touch {marker}', str(directory / 'evil.pth'))
    with pytest.raises(compat.UnsafeCheckpointError,
                       match=f'Refusing to load the checkpoint {re.escape(url)}/evil.pth .*posix.system, '):
        PretrainedLinear(f'{url}/evil.pth').init_weights()
    assert not marker.exists()


def test_our_checkpoints_and_plain_weights_files_load_from_a_url(tmp_path, caches, served):
    directory, url = served
    Runner.from_cfg(toy_cfg(tmp_path / 'trained', train_cfg=dict(max_epochs=1))).train()
    shutil.copy(tmp_path / 'trained' / 'epoch_1.pth', directory / 'ours.pth')  # message hub, numpy states, ...
    trained = torch.load(directory / 'ours.pth', weights_only=False)['state_dict']
    model = load_from_runner(tmp_path, f'{url}/ours.pth')
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, trained[name]), name
    assert (caches / 'torch_home' / 'hub' / 'checkpoints' / 'ours.pth').is_file()  # the normal cache

    weights = PretrainedLinear(None).state_dict()
    torch.save(weights, directory / 'plain.pth')  # torch.save of a state dict, as model zoos publish them
    module = PretrainedLinear(f'{url}/plain.pth')
    module.init_weights()
    assert weights.keys() == module.state_dict().keys()
    for name, tensor in module.state_dict().items():
        assert torch.equal(tensor, weights[name]), name


FAKE_MODULES = osp.join(REPO_ROOT, 'tests', 'fake_modules')  # petrel_client and pavi stand-ins, reading files


@pytest.mark.parametrize('scheme', ['torchvision://', 'modelzoo://', 'open-mmlab://', 'openmmlab://',
                                    'open-mmlab:// (a file in MMENGINE_HOME)', 'mmcls://', 's3://',
                                    'cluster:s3://', 'petrel://', 'pavi://'])
def test_every_mmengine_checkpoint_scheme_refuses_a_checkpoint_that_would_run_a_command(
        scheme, tmp_path, caches, served, monkeypatch):
    """Each of mmengine's CheckpointLoader schemes (runner/checkpoint.py L333-533) that resolves a name to a URL
    or reads the file's bytes, fed the crafted checkpoint the way it finds its files."""
    directory, url = served
    marker = tmp_path / 'the_command_ran'
    save_a_checkpoint_that_runs(f'touch {marker}', str(directory / 'evil.pth'))
    # The name lists each scheme resolves names with: torchvision's model_urls (torchvision 0.29 has none left),
    # mmengine's open_mmlab.json extended by $MMENGINE_HOME/open_mmlab.json (a URL or a file there), mmcls.json.
    monkeypatch.setattr(checkpoint_module, 'get_torchvision_models', lambda: {'evil': f'{url}/evil.pth'})
    mmengine_home = caches / 'mmengine_home'
    mmengine_home.mkdir(parents=True, exist_ok=True)
    (mmengine_home / 'open_mmlab.json').write_text(json.dumps(dict(evil=f'{url}/evil.pth',
                                                                   evil_file='evil_file.pth')))
    shutil.copy(directory / 'evil.pth', mmengine_home / 'evil_file.pth')
    monkeypatch.setattr(checkpoint_module, 'get_mmcls_models', lambda: {'evil': f'{url}/evil.pth'})
    # s3:// and pavi:// read through petrel_client and pavi, which fake_modules stands in for
    monkeypatch.syspath_prepend(FAKE_MODULES)
    for module in ('petrel_client', 'petrel_client.client', 'pavi', 'pavi.modelcloud'):
        monkeypatch.setitem(sys.modules, module, importlib.import_module(module))  # and gone after the test
    monkeypatch.setenv('FAKE_OBJECT_STORE', str(directory))
    monkeypatch.setattr(fileio_io, 'backend_instances', {})  # no PetrelBackend cached by an earlier test
    name = 'evil_file' if 'MMENGINE_HOME' in scheme else 'evil'
    filename = scheme.split(' ')[0] + ('bucket/evil.pth' if scheme.endswith(('s3://', 'petrel://', 'pavi://'))
                                       else name)
    with pytest.raises(compat.UnsafeCheckpointError, match=r'Refusing to load the checkpoint .*: it holds '
                       'posix.system, '):
        load_checkpoint(nn.Linear(2, 1), filename)
    assert not marker.exists()


def test_a_pavi_checkpoint_without_pavi_says_that_it_needs_the_model_cloud(monkeypatch):
    monkeypatch.setitem(sys.modules, 'pavi', None)  # not installed (it is not, on most machines)
    with pytest.raises(ImportError, match=r"Loading pavi://bucket/model.pth needs pavi, the client of "
                       r"OpenMMLab's model cloud, .*not reachable offline\). Download the checkpoint and give its "
                       'local path instead'):
        load_checkpoint(nn.Linear(2, 1), 'pavi://bucket/model.pth')
