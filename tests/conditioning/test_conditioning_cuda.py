"""The batched path on a CUDA device, with nothing but torch and condtok_mm.conditioning imported: no host sync,
CUDA-graph capture and replay, torch.compile, half-precision tokens under autocast, and the same X + C as on the
CPU. Marked `gpu` (skipped without CUDA); where only torch is installed they run as
``python -m pytest --noconftest tests/conditioning/test_conditioning_cuda.py`` with the checkout and its tests/ on
PYTHONPATH (tools/benchmark/gpu_conditioner.sh)."""
import pytest
import torch
from helpers.precision import low_precision_check

from condtok_mm.conditioning import condition_number, condition_tokens, condition_valid_regions

pytestmark = pytest.mark.gpu


def _padded_batch(batch=2, seed=0):
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.nn.functional.layer_norm(torch.randn(batch, 24, 40, 96, generator=gen), (96, ))
    sizes = torch.tensor([[24 - 7 * (b % 2), 40 - 11 * (b % 3)] for b in range(batch)])
    return tokens.cuda(), sizes.cuda()


def _region_kappas(grid, sizes):
    return torch.stack([condition_number(grid[b, :h, :w].reshape(h * w, -1).cpu().double())
                        for b, (h, w) in enumerate(sizes.tolist())])


@pytest.mark.parametrize('solver', ['auto', 'newton_schulz'])
def test_batched_path_runs_without_a_host_sync(solver):
    tokens, sizes = _padded_batch()
    condition_valid_regions(tokens, sizes, solver=solver)  # warm-up: allocations, the deferred status's buffer
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode('error')
    try:
        out = condition_valid_regions(tokens, sizes, solver=solver)
    finally:
        torch.cuda.set_sync_debug_mode('default')
    want = condition_valid_regions(tokens.cpu(), sizes.cpu(), solver='eigh')
    torch.testing.assert_close(out.cpu(), want, rtol=1e-4, atol=1e-4)
    assert (_region_kappas(out, sizes) <= 2 * (1 + 1e-4)).all()


def test_batched_path_is_captured_in_a_cuda_graph_and_replays_new_tokens_and_sizes():
    tokens, sizes = _padded_batch()
    static_tokens, static_sizes = tokens.clone(), sizes.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up on a side stream, as capture requires
        condition_valid_regions(static_tokens, static_sizes, solver='newton_schulz')
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = condition_valid_regions(static_tokens, static_sizes, solver='newton_schulz')
    other, _ = _padded_batch(seed=1)
    static_tokens.copy_(other)
    static_sizes.copy_(torch.tensor([[9, 40], [24, 3]], device='cuda'))
    graph.replay()
    torch.cuda.synchronize()
    want = condition_valid_regions(other, static_sizes.clone(), solver='newton_schulz')
    torch.testing.assert_close(static_out, want, rtol=1e-6, atol=1e-6)
    assert (_region_kappas(static_out, static_sizes) <= 2 * (1 + 1e-4)).all()


@pytest.mark.parametrize('solver', ['eigh', 'newton_schulz'])
def test_compiled_batched_path_matches_eager(solver):
    tokens, sizes = _padded_batch()
    compiled = torch.compile(lambda x, s: condition_valid_regions(x, s, solver=solver), dynamic=False)
    torch.testing.assert_close(compiled(tokens, sizes), condition_valid_regions(tokens, sizes, solver=solver),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16], ids=['fp16', 'bf16'])
def test_half_precision_tokens_under_autocast_stay_within_the_rounding_bound(dtype):
    # a patch embedding without a LayerNorm (ViT's) hands the conditioner autocast's dtype
    torch.manual_seed(0)
    embed = torch.nn.Conv2d(3, 48, 16, 16).cuda()
    with torch.no_grad(), torch.autocast('cuda', dtype=dtype):
        tokens = embed(torch.randn(2, 3, 256, 320, device='cuda')).permute(0, 2, 3, 1)
        out = condition_valid_regions(tokens, torch.tensor([[16, 20], [11, 13]], device='cuda'))
    assert tokens.dtype == out.dtype == dtype and torch.isfinite(out).all()
    whole = tokens[:1].reshape(1, -1, 48).cpu()
    error, budget, kappa, kappa_bound = low_precision_check(whole, out[:1].reshape(1, -1, 48).cpu(), 'sigma_max',
                                                            solver='newton_schulz')
    assert (error <= budget).all() and (kappa <= kappa_bound).all(), (error, budget, kappa, kappa_bound)
    assert torch.equal(out[1, 11:], tokens[1, 11:]) and torch.equal(out[1, :, 13:], tokens[1, :, 13:])


def test_rank_deficient_tokens_condition_the_same_on_cuda_and_cpu():
    """Several null directions per image (rank 20 of 48 channels) and a LayerNorm'd one (the ones vector): the
    completion of the null space is canonical, so cuSOLVER's and LAPACK's eigenvector bases give one X + C."""
    gen = torch.Generator().manual_seed(0)
    low_rank = torch.randn(2, 300, 20, generator=gen) @ torch.randn(20, 48, generator=gen)
    layer_normed = torch.nn.functional.layer_norm(torch.randn(2, 300, 48, generator=gen), (48, ))
    # the batched path (each solver on both devices: its X + C is a spectral function of a full-rank matrix) and
    # the reference's canonical completion
    for options in (dict(solver='eigh'), dict(solver='newton_schulz'), dict(solver='reference_gram')):
        for tokens in (low_rank, layer_normed):
            grid = tokens.view(2, 15, 20, 48)
            on_cpu = condition_tokens(grid, **options)
            on_cuda = condition_tokens(grid.cuda(), **options)
            torch.testing.assert_close(on_cuda.cpu(), on_cpu, rtol=1e-5, atol=1e-5 * float(on_cpu.abs().max()))
            assert (condition_number(on_cuda.view(2, 300, 48).cpu().double()) <= 2 + 1e-3).all()
