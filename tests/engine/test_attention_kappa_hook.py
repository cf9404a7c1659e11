import glob
import json
import time
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
from condtok_mm.engine.hooks.kappa_probe import KappaProbe
from condtok_mm.models.layout import find_attention_modules
from condtok_mm.registry import HOOKS, MODELS
from condtok_mm.models.valid_region import record_valid_region
from helpers.cfg_options import cfg_options_dict, data_options
from helpers.processes import free_port
from helpers.repo import DEMO, REPO_ROOT
from helpers.tokens import window_matrices

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
    probe = KappaProbe(wrapper, max_matrices=1000)
    assert [name for name, _ in find_attention_modules(wrapper)] == ['attn']
    probe.active = True
    attention(torch.randn(3, 16, 16))  # 3 windows of 16 tokens, 2 heads
    scalars = probe.reduce()

    softmax = numpy_kappa(seen['softmax'].double().reshape(-1, 16, 16).numpy())
    heads = seen['heads'].double().reshape(3, 16, 2, 8).permute(0, 2, 1, 3).reshape(-1, 16, 8).numpy()
    outputs = numpy_kappa(heads)
    w_q, w_k, w_v = (numpy_kappa(w.reshape(2, 8, 16).numpy()).mean()  # per head: 8 x 16 blocks
                     for w in attention.qkv.weight.detach().double().chunk(3))
    np.testing.assert_allclose(scalars['kappa/attn_softmax_mean/layer00'], softmax.mean(), rtol=1e-9)
    np.testing.assert_allclose(scalars['kappa/attn_softmax_max/layer00'], softmax.max(), rtol=1e-9)
    np.testing.assert_allclose(scalars['kappa/attn_out_mean/layer00'], outputs.mean(), rtol=1e-9)
    np.testing.assert_allclose(scalars['kappa/attn_out_max/layer00'], outputs.max(), rtol=1e-9)
    for key, want in (('w_q', w_q), ('w_k', w_k), ('w_v', w_v)):
        np.testing.assert_allclose(scalars[f'kappa/{key}_mean/layer00'], want, rtol=1e-9)
    assert probe.reduce() == {}  # reset after reducing


@pytest.mark.parametrize('conditioned', [True, False])
@pytest.mark.slow
def test_token_kappa_before_and_after_the_correction(conditioned):
    torch.manual_seed(0)
    backbone = MODELS.build(dict(type='CondSwinTransformer', **SMALL_SWIN,
                                 conditioning=dict(type='TokenConditioner') if conditioned else None))
    probe = KappaProbe(backbone)
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
        'w_v_mean', 'w_v_max', 'attn_input_mean', 'attn_input_max', 'attn_input_centred_mean',
        'attn_input_centred_max'} | ({'correction_mean', 'correction_max'} if conditioned else set())


def test_probe_is_silent_when_inactive():
    backbone = MODELS.build(dict(type='CondSwinTransformer', **SMALL_SWIN))
    probe = KappaProbe(backbone)
    backbone(torch.randn(1, 3, 32, 32))
    assert probe.reduce() == {}


def test_invalid_interval_is_rejected():
    with pytest.raises(ValueError, match='interval=0 is invalid'):
        HOOKS.build(dict(type='AttentionKappaHook', interval=0))


def train(shapes_root, work_dir, with_hook):
    cfg = Config.fromfile(DEMO)
    cfg.merge_from_dict(cfg_options_dict(data_options(shapes_root, 1)))
    cfg.train_dataloader.dataset.indices = 8  # two iterations of 4 images
    cfg.val_cfg = cfg.val_dataloader = cfg.val_evaluator = None
    cfg.custom_hooks = [dict(type='AttentionKappaHook', interval=1)] if with_hook else []
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
    assert last['scale/correction_mean/stage0'] > 1 and 1 < last['kappa/attn_input_centred_mean/stage0'] < 1e16
    assert last['kappa/tokens_out_max/stage0'] <= 2 + 1e-3
    assert sum(k.startswith('kappa/attn_softmax_mean/layer') for k in last) == 5  # depths 1+1+2+1
    (log_file, ) = glob.glob(str(tmp_path / 'with' / '*' / '*.log'))
    log = open(log_file).read()
    assert 'Iter(train) [2] kappa: stage0 tokens kappa' in log and 'layer04' in log
    assert ', attention input kappa ' in log and '(scale x' in log
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
    for row in ('kappa/tokens_out         stage0', 'kappa/attn_input_centred stage0',
                'scale/correction         stage0', 'kappa/attn_softmax       layer04'):
        assert row in result.stdout
    measured = json.load(open(tmp_path / 'measure_conditioning.json'))
    assert measured['num_images'] == 3
    assert measured['kappa']['kappa/tokens_out_max/stage0'] <= 2 + 1e-3
    assert (tmp_path / 'measure_conditioning.png').read_bytes()[:4] == b'\x89PNG'


def numpy_ones_complement(d):
    _, _, vh = np.linalg.svd(np.ones((1, d)))
    return vh[1:].T


def numpy_window_validity(valid_hw, grid_hw, window_size):
    """(num_windows, window_size ** 2) bool for one image: its valid tokens, window by window, in the
    top-left-first order of a window partition of the zero-padded grid."""
    rows, cols = -(-grid_hw[0] // window_size), -(-grid_hw[1] // window_size)
    valid = np.zeros((rows * window_size, cols * window_size), dtype=bool)
    valid[:valid_hw[0], :valid_hw[1]] = True
    return valid.reshape(rows, window_size, cols, window_size).transpose(0, 2, 1, 3).reshape(rows * cols, -1)


@pytest.mark.parametrize('position, scope', [('embedding', 'image'), ('attention_input', 'image'),
                                             ('attention_input', 'window')])
@pytest.mark.slow
def test_attention_input_scale_and_padding_free_kappa_equal_numpy(position, scope):
    """A hand-built case: a padded batch of two images, a conditioned Swin stage 0, every matrix recorded."""
    torch.manual_seed(0)
    backbone = MODELS.build(dict(type='CondSwinTransformer', **SMALL_SWIN,
                                 conditioning=dict(type='TokenConditioner', position=position, scope=scope)))
    probe = KappaProbe(backbone, max_matrices=10_000)
    seen = {}
    block = backbone.stages[0].blocks[0]
    block.norm1.register_forward_hook(lambda m, a, out: seen.__setitem__('norm1', out.detach().double()))
    backbone.conditioners['0'].register_forward_hook(
        lambda m, a, out: seen.update(cond_in=a[0].detach().double(), cond_out=out.detach().double()))
    block.attn.w_msa.softmax.register_forward_hook(lambda m, a, out: seen.__setitem__('softmax', out.detach().double()))
    batch = torch.randn(2, 3, 64, 80)
    record_valid_region(batch, [(64, 80), (40, 50)])  # token grids 16 x 20 and 10 x 13
    probe.active = True
    with torch.no_grad():
        backbone(batch)
    scalars = probe.reduce()
    valid = [(16, 20), (10, 13)]

    # what the first attention multiplies: norm1's output, per 4 x 4 window of each image's valid tokens
    norm1 = seen['norm1'].view(2, 16, 20, 32)
    windows = [m.numpy() for image, (h, w) in enumerate(valid)
               for m in window_matrices(norm1[image:image + 1, :h, :w], 4).values()]
    plain = np.minimum([np.linalg.cond(m) for m in windows], 1e16)
    centred = [np.linalg.cond(m @ numpy_ones_complement(32)) for m in windows]
    np.testing.assert_allclose(scalars['kappa/attn_input_mean/stage0'], plain.mean(), rtol=1e-6)
    np.testing.assert_allclose(scalars['kappa/attn_input_centred_mean/stage0'], np.mean(centred), rtol=1e-9)
    np.testing.assert_allclose(scalars['kappa/attn_input_centred_max/stage0'], np.max(centred), rtol=1e-9)
    if position == 'attention_input':  # the conditioner acted on norm1's output: kappa <= 2 where it bounds it
        images = [norm1[i, :h, :w].reshape(h * w, 32).numpy() for i, (h, w) in enumerate(valid)]
        assert max(np.linalg.cond(m) for m in (windows if scope == 'window' else images)) <= 2 + 1e-3

    # r = ||X + C||_F / ||X||_F of each image's valid tokens
    cond_in, cond_out = seen['cond_in'].view(2, 16, 20, 32), seen['cond_out'].view(2, 16, 20, 32)
    ratios = [np.linalg.norm(cond_out[i, :h, :w].numpy()) / np.linalg.norm(cond_in[i, :h, :w].numpy())
              for i, (h, w) in enumerate(valid)]
    np.testing.assert_allclose(scalars['scale/correction_mean/stage0'], np.mean(ratios), rtol=1e-9)
    np.testing.assert_allclose(scalars['scale/correction_max/stage0'], np.max(ratios), rtol=1e-9)
    assert np.min(ratios) > 1  # the correction makes the tokens bigger

    # the first block's softmax, restricted to each window's valid queries and keys
    softmax = seen['softmax'].numpy()  # (2 images x 20 windows, 1 head, 16, 16)
    masks = np.concatenate([numpy_window_validity(v, (16, 20), 4) for v in valid])
    kappas = [np.linalg.cond(softmax[w, head][np.ix_(keep, keep)])
              for w, keep in enumerate(masks) if keep.any() for head in range(softmax.shape[1])]
    np.testing.assert_allclose(scalars['kappa/attn_softmax_mean/layer00'], np.mean(kappas), rtol=1e-6)
    np.testing.assert_allclose(scalars['kappa/attn_softmax_max/layer00'], np.max(kappas), rtol=1e-6)
    assert np.max(kappas) < 1e6  # without padded keys the border windows are not singular

    # per-head kappa of the projections: blocks of (head dim x C) rows of each of W_q, W_k, W_v
    layer = backbone.stages[1].blocks[0].attn.w_msa  # 2 heads of 32 channels in stage 1
    weight = layer.qkv.weight.detach().double().numpy()
    for name, part in zip(('w_q', 'w_k', 'w_v'), np.split(weight, 3)):
        per_head = [np.linalg.cond(block) for block in np.split(part, 2)]
        np.testing.assert_allclose(scalars[f'kappa/{name}_mean/layer01'], np.mean(per_head), rtol=1e-9)
        np.testing.assert_allclose(scalars[f'kappa/{name}_max/layer01'], np.max(per_head), rtol=1e-9)


def test_vitdet_global_and_window_attention_inputs_exclude_padding():
    torch.manual_seed(0)
    backbone = MODELS.build(dict(type='CondViT', img_size=64, patch_size=8, embed_dim=24, depth=2, num_heads=2,
                                 window_size=3, window_block_indexes=[1], pretrain_img_size=64))
    probe = KappaProbe(backbone, max_matrices=10_000)
    seen = {}
    backbone.blocks[0].norm1.register_forward_hook(lambda m, a, out: seen.__setitem__('norm1', out.detach().double()))
    batch = torch.randn(2, 3, 64, 64)
    record_valid_region(batch, [(64, 64), (33, 20)])  # valid token grids 8 x 8 and 5 x 3
    probe.active = True
    with torch.no_grad():
        backbone(batch)
    scalars = probe.reduce()
    # block 0 attends globally: one matrix per image, its valid tokens only
    matrices = [seen['norm1'][0].reshape(64, 24).numpy(), seen['norm1'][1, :5, :3].reshape(15, 24).numpy()]
    centred = [np.linalg.cond(m @ numpy_ones_complement(24)) for m in matrices]
    np.testing.assert_allclose(scalars['kappa/attn_input_centred_mean/stage0'], np.mean(centred), rtol=1e-9)


def _reduce_different_keys(rank, world_size, port, results):
    import datetime

    import torch.distributed as dist
    dist.init_process_group('gloo', init_method=f'tcp://127.0.0.1:{port}', rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=30))  # a mismatched collective fails, never hangs
    try:
        probe = KappaProbe(torch.nn.Identity())
        probe.records.add('kappa/tokens_in/stage0', torch.tensor([1.0 + rank, 3.0]))
        if rank == 1:  # e.g. only this rank's attention matrices were small enough to record
            probe.records.add('kappa/attn_softmax/layer00', torch.tensor([5.0, 7.0, 9.0]))
        results[rank] = probe.reduce()
    finally:
        dist.destroy_process_group()


def test_ranks_that_recorded_different_quantities_reduce_over_the_union():
    import torch.multiprocessing as mp
    results = mp.Manager().dict()
    ranks = mp.start_processes(_reduce_different_keys, args=(2, free_port(), results), nprocs=2, start_method='fork',
                               join=False)
    deadline = time.monotonic() + 120
    while not ranks.join(timeout=5):
        if time.monotonic() > deadline:
            for process in ranks.processes:
                process.kill()
            pytest.fail('the two ranks did not finish reducing within 120 s')
    assert results[0] == results[1] == {
        'kappa/tokens_in_mean/stage0': (1 + 3 + 2 + 3) / 4, 'kappa/tokens_in_max/stage0': 3.0,
        'kappa/attn_softmax_mean/layer00': 7.0, 'kappa/attn_softmax_max/layer00': 9.0}
