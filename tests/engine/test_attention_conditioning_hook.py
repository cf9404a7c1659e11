import glob
import json
import os.path as osp
import subprocess
import sys

import numpy as np
import pytest
import torch
from mmdet.models.backbones.swin import WindowMSA
from mmengine.config import Config
from mmengine.runner import Runner

import condtok_mm  # noqa: F401
from condtok_mm.engine.hooks.attention_conditioning import ConditioningProbe, find_attention_modules
from condtok_mm.registry import HOOKS, MODELS
from conftest import DEMO, REPO_ROOT, cfg_options_dict, data_options

SMALL_SWIN = dict(embed_dims=32, depths=(1, 1, 2, 1), num_heads=(1, 2, 4, 8), window_size=4)


def numpy_kappa(matrices):
    return np.array([np.linalg.cond(m) for m in matrices])


def test_attention_kappa_equals_numpy_on_known_matrices():
    torch.manual_seed(0)
    attention = WindowMSA(embed_dims=16, num_heads=2, window_size=(4, 4))
    seen = {}
    attention.softmax.register_forward_hook(lambda m, a, out: seen.__setitem__('softmax', out.detach()))
    attention.proj.register_forward_pre_hook(lambda m, a: seen.__setitem__('heads', a[0].detach()))
    wrapper = torch.nn.Module()
    wrapper.attn = attention
    probe = ConditioningProbe(wrapper, max_matrices=1000)
    assert [name for name, _ in find_attention_modules(wrapper)] == ['attn']
    probe.active = True
    attention(torch.randn(3, 16, 16))  # 3 windows of 16 tokens, 2 heads
    scalars = probe.reduce()

    softmax = numpy_kappa(seen['softmax'].double().reshape(-1, 16, 16).numpy())
    heads = seen['heads'].double().reshape(3, 16, 2, 8).permute(0, 2, 1, 3).reshape(-1, 16, 8).numpy()
    outputs = numpy_kappa(heads)
    w_q, w_k, w_v = (np.linalg.cond(w) for w in attention.qkv.weight.detach().double().chunk(3).__iter__())
    np.testing.assert_allclose(scalars['kappa/attn_softmax_mean/layer00'], softmax.mean(), rtol=1e-9)
    np.testing.assert_allclose(scalars['kappa/attn_softmax_max/layer00'], softmax.max(), rtol=1e-9)
    np.testing.assert_allclose(scalars['kappa/attn_out_mean/layer00'], outputs.mean(), rtol=1e-9)
    np.testing.assert_allclose(scalars['kappa/attn_out_max/layer00'], outputs.max(), rtol=1e-9)
    for key, want in (('w_q', w_q), ('w_k', w_k), ('w_v', w_v)):
        np.testing.assert_allclose(scalars[f'kappa/{key}_mean/layer00'], want, rtol=1e-9)
    assert probe.reduce() == {}  # reset after reducing


@pytest.mark.parametrize('conditioned', [True, False])
def test_token_kappa_before_and_after_the_correction(conditioned):
    torch.manual_seed(0)
    backbone = MODELS.build(dict(type='CondSwinTransformer', **SMALL_SWIN,
                                 conditioning=dict(type='TokenConditioner') if conditioned else None))
    probe = ConditioningProbe(backbone)
    assert len(probe.attention_layers) == sum(SMALL_SWIN['depths'])
    x = torch.randn(2, 3, 64, 64)
    probe.active = True
    backbone(x)
    scalars = probe.reduce()
    tokens, _ = backbone.patch_embed(x)
    before = numpy_kappa(tokens.detach().double().numpy())
    np.testing.assert_allclose(scalars['kappa/tokens_in_mean/stage0'], min(before.mean(), 1e16), rtol=1e-9)
    if conditioned:
        assert scalars['kappa/tokens_out_max/stage0'] <= 2 + 1e-3
    else:
        assert scalars['kappa/tokens_out_mean/stage0'] == scalars['kappa/tokens_in_mean/stage0']
    assert set(k.split('/')[1] for k in scalars) == {
        'tokens_in_mean', 'tokens_in_max', 'tokens_out_mean', 'tokens_out_max', 'attn_softmax_mean',
        'attn_softmax_max', 'attn_out_mean', 'attn_out_max', 'w_q_mean', 'w_q_max', 'w_k_mean', 'w_k_max',
        'w_v_mean', 'w_v_max'}


def test_probe_is_silent_when_inactive():
    backbone = MODELS.build(dict(type='CondSwinTransformer', **SMALL_SWIN))
    probe = ConditioningProbe(backbone)
    backbone(torch.randn(1, 3, 32, 32))
    assert probe.reduce() == {}


def test_invalid_interval_is_rejected():
    with pytest.raises(ValueError, match='interval=0 is invalid'):
        HOOKS.build(dict(type='AttentionConditioningHook', interval=0))


def train(shapes_root, work_dir, with_hook):
    cfg = Config.fromfile(DEMO)
    cfg.merge_from_dict(cfg_options_dict(data_options(shapes_root, 1)))
    cfg.train_dataloader.dataset.indices = 8  # two iterations of 4 images
    cfg.val_cfg = cfg.val_dataloader = cfg.val_evaluator = None
    cfg.custom_hooks = [dict(type='AttentionConditioningHook', interval=1)] if with_hook else []
    cfg.randomness = dict(seed=0, deterministic=True)
    cfg.work_dir = str(work_dir)
    cfg.visualizer.name = str(work_dir)  # visualizers are per-process singletons by name
    runner = Runner.from_cfg(cfg)
    runner.train()
    losses = [h for h in runner.message_hub.get_scalar('train/loss').data[0]]
    return runner, losses


@pytest.mark.slow
def test_recording_does_not_change_training_and_writes_log_scalars_and_tensorboard(shapes_root, tmp_path):
    runner, with_hook = train(shapes_root, tmp_path / 'with', with_hook=True)
    _, without_hook = train(shapes_root, tmp_path / 'without', with_hook=False)
    assert len(with_hook) == 2 and with_hook == without_hook

    (scalars_file, ) = glob.glob(str(tmp_path / 'with' / '*' / 'vis_data' / 'scalars.json'))
    records = [json.loads(line) for line in open(scalars_file)]
    kappa_steps = [r['step'] for r in records if 'kappa/tokens_out_mean/stage0' in r]
    assert kappa_steps == [1, 2]
    last = [r for r in records if 'kappa/tokens_out_mean/stage0' in r][-1]
    assert last['kappa/tokens_out_max/stage0'] <= 2 + 1e-3
    assert sum(k.startswith('kappa/attn_softmax_mean/layer') for k in last) == 5  # depths 1+1+2+1
    (log_file, ) = glob.glob(str(tmp_path / 'with' / '*' / '*.log'))
    log = open(log_file).read()
    assert 'Iter(train) [2] conditioning: stage0 tokens kappa' in log and 'layer04' in log
    assert glob.glob(str(tmp_path / 'with' / '*' / 'vis_data' / 'events.out.tfevents.*'))

    # the plot tool reads the real work dirs and writes a PNG
    out = tmp_path / 'kappa.png'
    result = subprocess.run([sys.executable, osp.join(REPO_ROOT, 'tools', 'analysis', 'plot_conditioning.py'),
                             str(tmp_path / 'with'), str(tmp_path / 'with'), '--labels', 'a', 'b',
                             '--out', str(out)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert out.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n' and out.stat().st_size > 20000
    no_kappa = subprocess.run([sys.executable, osp.join(REPO_ROOT, 'tools', 'analysis',
                                                        'plot_conditioning.py'), str(tmp_path / 'without')],
                              capture_output=True, text=True)
    assert no_kappa.returncode == 1 and 'no kappa/* values' in no_kappa.stderr


@pytest.mark.slow
def test_measure_tool_writes_table_json_and_png(shapes_root, tmp_path):
    options = [o for o in data_options(shapes_root, 1) if o.startswith('val_')]
    result = subprocess.run(
        [sys.executable, osp.join(REPO_ROOT, 'tools', 'analysis', 'measure_conditioning.py'), DEMO,
         '--num-images', '3', '--out-dir', str(tmp_path), '--cfg-options', *options],
        capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert 'tokens_out     stage0' in result.stdout and 'attn_softmax   layer04' in result.stdout
    measured = json.load(open(tmp_path / 'measure_conditioning.json'))
    assert measured['num_images'] == 3
    assert measured['kappa']['kappa/tokens_out_max/stage0'] <= 2 + 1e-3
    assert (tmp_path / 'measure_conditioning.png').read_bytes()[:4] == b'\x89PNG'
