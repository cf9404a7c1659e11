"""condtok_mm.compat.checkpoint_loading: every way a checkpoint is read (a local path, http(s)://, every other
mmengine scheme; load_from, init_cfg=Pretrained, tools/test.py) loads weights-only with the allow-list, refuses a
checkpoint whose pickle would run a command, and still loads ours and plain weights files."""
import importlib
import json
import os
import os.path as osp
import re
import shutil
import subprocess
import sys

import pytest
import torch
from mmengine.fileio import io as fileio_io
from mmengine.logging import HistoryBuffer
from mmengine.model import BaseModule
from mmengine.runner import Runner, load_checkpoint
from mmengine.runner import checkpoint as checkpoint_module
from torch import nn

from condtok_mm import compat
from condtok_mm.compat.checkpoint_loading import url_cache_name
from helpers.cfg_options import data_options
from helpers.repo import DEMO, REPO_ROOT
from helpers.loopback_server import serving
from helpers.toy_runner import toy_cfg

# The tests below run the fixes in this process (the opt-in our tools and configs make); the tests of what a
# bare import leaves alone run in fresh processes (test_opt_in.py).
compat.apply()


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
    # torch.hub's cache, as mmengine's, under a name keyed by the whole URL
    cached = caches / 'torch_home' / 'hub' / 'checkpoints' / url_cache_name(f'{url}/evil.pth')
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
    assert (caches / 'torch_home' / 'hub' / 'checkpoints' /
            url_cache_name(f'{url}/ours.pth')).is_file()  # the normal cache folder

    weights = PretrainedLinear(None).state_dict()
    torch.save(weights, directory / 'plain.pth')  # torch.save of a state dict, as model zoos publish them
    module = PretrainedLinear(f'{url}/plain.pth')
    module.init_weights()
    assert weights.keys() == module.state_dict().keys()
    for name, tensor in module.state_dict().items():
        assert torch.equal(tensor, weights[name]), name


def test_two_urls_that_end_in_the_same_file_name_load_their_own_weights(tmp_path, caches, served):
    directory, url = served
    for version, value in (('v1', 1.0), ('v2', 2.0)):
        (directory / version).mkdir()
        torch.save({'w': torch.full((2, ), value)}, directory / version / 'model.pth')
    first = load_checkpoint_from_url(f'{url}/v1/model.pth')
    second = load_checkpoint_from_url(f'{url}/v2/model.pth')
    assert first['w'].tolist() == [1.0, 1.0] and second['w'].tolist() == [2.0, 2.0]
    assert load_checkpoint_from_url(f'{url}/v1/model.pth')['w'].tolist() == [1.0, 1.0]  # from the cache
    names = sorted(p.name for p in (caches / 'torch_home' / 'hub' / 'checkpoints').iterdir())
    assert len(names) == 2 and all(name.endswith('-model.pth') for name in names)


def load_checkpoint_from_url(url):
    from mmengine.runner.checkpoint import CheckpointLoader
    return CheckpointLoader.load_checkpoint(url, map_location='cpu')


FAKE_MODULES = osp.join(REPO_ROOT, 'tests', 'compat', 'fake_modules')  # petrel_client and pavi stand-ins


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
    # The name lists each scheme resolves names with, each given the name 'evil': torchvision's model_urls,
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


def test_an_s3_checkpoint_without_petrel_client_says_that_it_needs_that_storage(monkeypatch):
    monkeypatch.setitem(sys.modules, 'petrel_client', None)  # not installed (it is not, on most machines)
    monkeypatch.setattr(fileio_io, 'backend_instances', {})
    with pytest.raises(ImportError, match=r'Loading s3://bucket/model.pth needs petrel_client, the client of '
                       r"OpenMMLab's Ceph storage, .*not reachable offline\). Download the checkpoint and give its "
                       'local path instead'):
        load_checkpoint(nn.Linear(2, 1), 's3://bucket/model.pth')
