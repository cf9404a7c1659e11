"""Every checkpoint our modules load in ``init_weights`` (their own ``init_cfg``, the backbone a wrapper holds) is
read weights-only with the allow-list in a host that did not opt in to condtok_mm.compat (a fresh process that
imports condtok_mm only, as ``custom_imports=['condtok_mm']`` does), and mmengine's loaders are as the host had
them afterwards."""
import json
import os
import subprocess
import sys

import pytest
import torch

from helpers.repo import REPO_ROOT
from helpers.loopback_server import serving

# Builds CFG in a process that imports condtok_mm only, runs init_weights, and prints what happened and whether
# mmengine's checkpoint loaders are the same objects afterwards.
SCRIPT = """
import json, sys
sys.path.insert(0, {repo!r})
import condtok_mm
from mmengine.config import ConfigDict
from mmengine.registry import init_default_scope
from mmengine.runner import checkpoint as checkpoint_module
from mmengine.runner.checkpoint import CheckpointLoader
from condtok_mm.registry import MODELS
init_default_scope('mmdet')
before, http_before = dict(CheckpointLoader._schemes), checkpoint_module.load_from_http
model = MODELS.build(ConfigDict({cfg!r}))  # as a config file gives it
try:
    model.init_weights()
    outcome = 'loaded'
except Exception as error:
    outcome = f'{{type(error).__name__}}: {{error}}'
after = dict(CheckpointLoader._schemes)
print(json.dumps(dict(outcome=outcome, loaders_kept=after.keys() == before.keys()
                      and all(after[key] is before[key] for key in before)
                      and checkpoint_module.load_from_http is http_before)))
"""

VITDET = dict(img_size=64, patch_size=16, embed_dim=32, depth=1, num_heads=2, window_size=2,
              window_block_indexes=(0, ))
SWIN = dict(embed_dims=32, depths=[1, 1, 1, 1], num_heads=[1, 2, 4, 8], window_size=4, convert_weights=False)
MODULES = {
    'CondViT': lambda url: dict(type='CondViT', **VITDET, init_cfg=dict(type='Pretrained', checkpoint=url)),
    'CondSwinTransformer': lambda url: dict(type='CondSwinTransformer', **SWIN,
                                            init_cfg=dict(type='Pretrained', checkpoint=url)),
    'CondTokBackbone': lambda url: dict(type='CondTokBackbone', backbone=dict(
        type='mmdet.ResNet', depth=18, init_cfg=dict(type='Pretrained', checkpoint=url)), targets=('conv1', )),
}


class RunsACommand:

    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command, )


def init_weights_in_a_host(cfg, tmp_path):
    env = {**os.environ, 'TORCH_HOME': str(tmp_path / 'torch_home'), 'NO_PROXY': '127.0.0.1,localhost',
           'no_proxy': '127.0.0.1,localhost'}
    result = subprocess.run([sys.executable, '-c', SCRIPT.format(repo=REPO_ROOT, cfg=cfg)], capture_output=True,
                            text=True, timeout=300, cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize('module', sorted(MODULES))
def test_a_url_checkpoint_that_would_run_a_command_is_refused_without_the_opt_in(module, tmp_path):
    served = tmp_path / 'served'
    served.mkdir()
    marker = tmp_path / 'the_command_ran'
    torch.save({'state_dict': {'w': torch.ones(1)}, 'meta': {'note': RunsACommand(f'touch {marker}')}},
               served / 'evil.pth')
    with serving(served) as url:
        result = init_weights_in_a_host(MODULES[module](f'{url}/evil.pth'), tmp_path)
    assert result['outcome'].startswith('UnsafeCheckpointError: Refusing to load the checkpoint '
                                        f'{url}/evil.pth'), result
    assert 'posix.system' in result['outcome'] and not marker.exists()
    assert result['loaders_kept']  # mmengine is left as the host has it


@pytest.mark.slow
def test_a_plain_url_checkpoint_still_loads_without_the_opt_in(tmp_path):
    from condtok_mm.registry import MODELS
    served = tmp_path / 'served'
    served.mkdir()
    torch.save(MODELS.build(dict(type='CondViT', **VITDET)).state_dict(), served / 'vit.pth')
    with serving(served) as url:
        result = init_weights_in_a_host(MODULES['CondViT'](f'{url}/vit.pth'), tmp_path)
    assert result == dict(outcome='loaded', loaders_kept=True)


def test_nested_and_concurrent_blocks_share_one_installation_and_restore_the_hosts_loaders():
    import threading

    from mmengine.runner import checkpoint as checkpoint_module
    from mmengine.runner.checkpoint import CheckpointLoader

    from condtok_mm.compat.checkpoint_loading import load_from_local, weights_only_loading

    def installed():
        return CheckpointLoader._schemes[''] is load_from_local

    host_schemes, host_http = dict(CheckpointLoader._schemes), checkpoint_module.load_from_http
    first_inside, second_done = threading.Event(), threading.Event()
    seen = []

    def other_thread():
        with weights_only_loading():
            first_inside.set()
            second_done.wait(timeout=30)
            seen.append(installed())  # the main thread's block ended first: still installed here

    with weights_only_loading():
        thread = threading.Thread(target=other_thread)
        thread.start()
        first_inside.wait(timeout=30)
        with weights_only_loading():
            assert installed()
        assert installed()
    second_done.set()
    thread.join(timeout=30)
    assert seen == [True]
    # the host's loaders back, the same objects
    assert CheckpointLoader._schemes.keys() == host_schemes.keys() and checkpoint_module.load_from_http is host_http
    assert all(CheckpointLoader._schemes[prefix] is loader for prefix, loader in host_schemes.items())


def test_every_module_of_ours_that_loads_an_init_cfg_checkpoint_reads_it_weights_only():
    from condtok_mm.models.backbones import CondSwinTransformer
    from condtok_mm.models.necks.rescale_fpn import RescaleFPN
    from condtok_mm.models.necks.vitdet_fpn import ViTDetFPN
    from condtok_mm.models.weights_only_init import WeightsOnlyInit
    from condtok_mm.models.wrappers import TransparentWrapper
    for module in (CondSwinTransformer, TransparentWrapper, RescaleFPN, ViTDetFPN):
        assert issubclass(module, WeightsOnlyInit), module.__name__
