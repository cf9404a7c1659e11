"""What only a CUDA device can check with the OpenMMLab stack: AMP training with the conditioner, per-window
conditioning on the GPU, the hook's NCCL reduction (the batched path's own CUDA tests, which need only torch, are in
tests/conditioning/test_conditioning_cuda.py). Marked `gpu`: skipped without CUDA; `make gpu-check` runs them."""
import os.path as osp

import pytest
import torch
import torch.distributed as torch_dist
from mmengine.config import Config
from mmengine.optim import AmpOptimWrapper, build_optim_wrapper
from mmengine.registry import init_default_scope
from mmdet.testing import demo_mm_inputs

import condtok_mm  # noqa: F401
from condtok_mm.conditioning import condition_number
from condtok_mm.engine.hooks.kappa_probe import KappaProbe, records
from condtok_mm.registry import MODELS
from helpers.processes import free_port
from helpers.repo import REPO_ROOT
from helpers.tokens import random_tokens, window_matrices
from helpers.precision import low_precision_check

pytestmark = pytest.mark.gpu

# A plain ViT, whose patch embedding has no LayerNorm: under autocast the conditioner gets fp16/bf16 tokens
# (Swin's LayerNorm runs in float32 under autocast, so its conditioner sees float32).
VITDET_DEMO = osp.join(REPO_ROOT, 'configs', 'demo', 'mask-rcnn_vit-mini-vitdet-condtok_simple-fpn_12e_shapes.py')


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16], ids=['fp16', 'bf16'])
def test_amp_training_step_conditions_low_precision_tokens(dtype):
    torch.manual_seed(0)
    cfg = Config.fromfile(VITDET_DEMO)
    init_default_scope('mmdet')
    model = MODELS.build(cfg.model).cuda()
    # a first loss scale that the small model's gradients do not overflow, so that the step is taken
    optim_wrapper = build_optim_wrapper(model, dict(cfg.optim_wrapper, dtype=str(dtype).split('.')[1],
                                                    loss_scale=dict(init_scale=1024.0)))
    assert isinstance(optim_wrapper, AmpOptimWrapper)
    seen = []
    model.backbone.conditioner.register_forward_hook(
        lambda module, args, output: seen.append((args[0].detach(), output.detach())))
    data = demo_mm_inputs(2, [(3, 128, 128)] * 2, num_items=[3, 3], num_classes=4, with_mask=True, device='cuda')
    before = model.backbone.patch_embed.proj.weight.detach().clone()
    model.train()
    losses = model.train_step(data, optim_wrapper)
    assert all(torch.isfinite(value).all() for value in losses.values())
    assert not torch.equal(before, model.backbone.patch_embed.proj.weight)
    tokens, conditioned = seen[0]
    assert tokens.dtype == conditioned.dtype == dtype and tokens.is_cuda
    error, budget, kappa, kappa_bound = low_precision_check(tokens.cpu(), conditioned.cpu(), 'sigma_max',
                                                            solver='newton_schulz')
    assert (error <= budget).all() and (kappa <= kappa_bound).all(), (error, budget, kappa, kappa_bound)


@pytest.mark.parametrize('hw, shift_size', [((17, 23), 0), ((17, 23), 3), ((28, 28), 0)])
def test_per_window_conditioning_on_cuda_matches_the_cpu(hw, shift_size):
    # the same solver on both devices (solver='auto' picks eigh on the CPU, Newton-Schulz on CUDA)
    conditioner = MODELS.build(dict(type='TokenConditioner', scope='window', window_size=7, shift_size=shift_size,
                                    solver='newton_schulz'))
    torch.manual_seed(0)
    tokens = torch.nn.functional.layer_norm(torch.randn(2, hw[0] * hw[1], 48), (48, ))
    on_cpu = conditioner(tokens, hw_shape=hw)
    on_cuda = conditioner(tokens.cuda(), hw_shape=hw)
    assert on_cuda.is_cuda
    torch.testing.assert_close(on_cuda.cpu(), on_cpu, rtol=1e-5, atol=1e-5)
    if shift_size == 0:
        for (top, left), window in window_matrices(on_cuda.view(2, *hw, 48).cpu(), 7).items():
            assert (condition_number(window) <= 2 + 1e-3).all(), (top, left)


def test_cond_swin_per_window_forward_on_cuda_matches_the_cpu():
    torch.manual_seed(0)
    model = MODELS.build(dict(type='CondSwinTransformer', embed_dims=32, depths=(1, 1, 2, 1), num_heads=(1, 2, 4, 8),
                              window_size=4, conditioning=dict(type='TokenConditioner', scope='window',
                                                               solver='newton_schulz')))
    model.eval()
    x = torch.randn(2, 3, 72, 100)
    with torch.no_grad():
        on_cpu = model(x)
        model.cuda()
        on_cuda = model(x.cuda())
    for a, b in zip(on_cuda, on_cpu):
        torch.testing.assert_close(a.cpu(), b, rtol=1e-4, atol=1e-4)


@pytest.fixture
def nccl_group():
    torch.cuda.set_device(0)
    torch_dist.init_process_group('nccl', init_method=f'tcp://127.0.0.1:{free_port()}', rank=0, world_size=1)
    yield
    torch_dist.destroy_process_group()


def test_hook_reduces_its_values_with_nccl(nccl_group, monkeypatch):
    backbone = MODELS.build(dict(type='CondSwinTransformer', embed_dims=32, depths=(1, 1, 2, 1),
                                 num_heads=(1, 2, 4, 8), window_size=4)).cuda()
    probe = KappaProbe(backbone)
    x = torch.randn(2, 3, 64, 64, device='cuda')
    probe.active = True
    backbone(x)
    local = dict(probe.records.values)
    expected = {}
    for key, values in local.items():
        family, quantity, where = key.split('/')
        expected[f'{family}/{quantity}_mean/{where}'] = float(torch.cat(values).mean())
        expected[f'{family}/{quantity}_max/{where}'] = float(torch.cat(values).max())
    # The reduction runs where more than one rank records; NCCL allows one rank per GPU, so this one rank
    # takes that path in a group of one: the sums and maxima over one rank are its own.
    monkeypatch.setattr(records, 'get_world_size', lambda: 2)
    reduced = probe.reduce()
    assert reduced.keys() == expected.keys()
    for key, value in expected.items():
        assert reduced[key] == pytest.approx(value, rel=1e-12), key
    assert reduced['kappa/tokens_out_max/stage0'] <= 2 + 1e-3


@pytest.mark.parametrize('epsilon', [0.6, 0.95])
def test_token_graying_on_cuda_matches_the_cpu(epsilon):
    conditioner = MODELS.build(dict(type='TokenConditioner', mode='graying', epsilon=epsilon))
    tokens = random_tokens(2, 17 * 23, 48, kappa=300.0)
    on_cpu = conditioner(tokens, hw_shape=(17, 23))
    on_cuda = conditioner(tokens.cuda(), hw_shape=(17, 23))
    assert on_cuda.is_cuda
    torch.testing.assert_close(on_cuda.cpu(), on_cpu, rtol=1e-5, atol=1e-5)
    # kappa -> kappa ** epsilon
    assert torch.allclose(condition_number(on_cuda.cpu()), condition_number(tokens) ** epsilon, rtol=1e-3)


# Relative (Frobenius) error of each output under autocast against float32: measured 0.1 % (fp16) and 1.1 %
# (bf16) at most with CPU autocast; a lost lambda I (10 x the projection's input) would be off by far more.
# (mmdet's Swin returns its outputs through LayerNorms, which autocast runs in float32.)
@pytest.mark.parametrize('dtype, bound', [(torch.float16, 0.01), (torch.bfloat16, 0.05)], ids=['fp16', 'bf16'])
def test_spectral_attention_on_cuda_matches_the_cpu_also_under_autocast(dtype, bound):
    torch.manual_seed(0)
    model = MODELS.build(dict(type='SpectralAttentionBackbone', lam=10.0,
                              backbone=dict(type='mmdet.SwinTransformer', embed_dims=32, depths=(1, 1, 2, 1),
                                            num_heads=(1, 2, 4, 8), window_size=4)))
    model.eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        on_cpu = model(x)
        model.cuda()
        on_cuda = model(x.cuda())
        with torch.autocast('cuda', dtype=dtype):
            on_cuda_amp = model(x.cuda())
    for full, low, reference in zip(on_cuda, on_cuda_amp, on_cpu):
        torch.testing.assert_close(full.cpu(), reference, rtol=1e-4, atol=1e-4)
        assert torch.isfinite(low).all() and not torch.equal(low, full)  # autocast changed the arithmetic
        assert float((low.float().cpu() - reference).norm() / reference.norm()) <= bound
