"""What only a CUDA device can check: AMP training with the conditioner, per-window conditioning on the GPU,
the hook's NCCL reduction. Marked `gpu`: skipped without CUDA; `make gpu-check` runs them."""
import os.path as osp

import pytest
import torch
import torch.distributed as torch_dist
from mmengine.config import Config
from mmengine.optim import AmpOptimWrapper, build_optim_wrapper
from mmengine.registry import init_default_scope
from mmdet.testing import demo_mm_inputs

import condtok_mm  # noqa: F401
from condtok_mm.conditioning import condition_number, condition_tokens
from condtok_mm.engine.hooks.conditioning_probe import ConditioningProbe, records
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
                                                            method='batched')
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
    probe = ConditioningProbe(backbone)
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


def test_rank_deficient_tokens_condition_the_same_on_cuda_and_cpu():
    """Several null directions per image (rank 20 of 48 channels) and a LayerNorm'd one (the ones vector): the
    completion of the null space is canonical, so cuSOLVER's and LAPACK's eigenvector bases give one X + C."""
    gen = torch.Generator().manual_seed(0)
    low_rank = torch.randn(2, 300, 20, generator=gen) @ torch.randn(20, 48, generator=gen)
    layer_normed = torch.nn.functional.layer_norm(torch.randn(2, 300, 48, generator=gen), (48, ))
    # the batched path (each solver on both devices: its X + C is a spectral function of a full-rank matrix) and
    # the reference's canonical completion
    for options in (dict(solver='eigh'), dict(solver='newton_schulz'), dict(method='gram')):
        for tokens in (low_rank, layer_normed):
            grid = tokens.view(2, 15, 20, 48)
            on_cpu = condition_tokens(grid, **options)
            on_cuda = condition_tokens(grid.cuda(), **options)
            torch.testing.assert_close(on_cuda.cpu(), on_cpu, rtol=1e-5, atol=1e-5 * float(on_cpu.abs().max()))
            assert (condition_number(on_cuda.view(2, 300, 48).cpu().double()) <= 2 + 1e-3).all()


def _padded_cuda_batch():
    gen = torch.Generator().manual_seed(0)
    tokens = torch.nn.functional.layer_norm(torch.randn(2, 24 * 40, 96, generator=gen), (96, )).cuda()
    return tokens, torch.tensor([[24, 40], [17, 29]], device='cuda')


@pytest.mark.gpu
def test_batched_conditioner_runs_without_a_host_sync():
    from condtok_mm.models.token_conditioner import TokenConditioner
    conditioner = TokenConditioner()  # solver='auto': Newton-Schulz on CUDA; check='auto': deferred status
    tokens, sizes = _padded_cuda_batch()
    conditioner(tokens, hw_shape=(24, 40), valid_shapes=sizes)  # warm-up: allocations, pinned buffer
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode('error')
    try:
        out = conditioner(tokens, hw_shape=(24, 40), valid_shapes=sizes)
    finally:
        torch.cuda.set_sync_debug_mode('default')
    want = TokenConditioner(solver='eigh')(tokens.cpu(), hw_shape=(24, 40), valid_shapes=sizes.cpu())
    torch.testing.assert_close(out.cpu(), want, rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
def test_batched_conditioner_is_captured_in_a_cuda_graph():
    from condtok_mm.models.token_conditioner import TokenConditioner
    conditioner = TokenConditioner(solver='newton_schulz')
    tokens, sizes = _padded_cuda_batch()
    static_tokens, static_sizes = tokens.clone(), sizes.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up on a side stream, as CUDA-graph capture requires
        conditioner(static_tokens, hw_shape=(24, 40), valid_shapes=static_sizes)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = conditioner(static_tokens, hw_shape=(24, 40), valid_shapes=static_sizes)
    other = torch.nn.functional.layer_norm(torch.randn_like(tokens), (96, ))
    static_tokens.copy_(other)
    static_sizes.copy_(torch.tensor([[9, 40], [24, 3]], device='cuda'))
    graph.replay()
    torch.cuda.synchronize()
    want = conditioner(other, hw_shape=(24, 40), valid_shapes=static_sizes.clone())
    torch.testing.assert_close(static_out, want, rtol=1e-6, atol=1e-6)
