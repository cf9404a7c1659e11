"""Token Graying (mode='graying'): X = U S V^T -> U (S / s_1)^eps V^T, against numpy's float64 SVD."""
import numpy as np
import pytest
import torch

from condtok_mm.conditioning import (RANK_RTOL, condition_number, condition_tokens, condition_valid_regions,
                                     token_correction)
from condtok_mm.registry import MODELS
from helpers.tokens import STAGE_SHAPES, random_tokens, window_matrices

SOLVERS = ('auto', 'reference_gram', 'reference_svd')


def numpy_graying(x, epsilon, alpha=1.0):
    """Reference X + C for one float64 matrix: singular values s -> (s / s_1)^eps, round-off-level ones -> 0."""
    u, s, vh = np.linalg.svd(x, full_matrices=False)
    grayed = np.where(s > RANK_RTOL * s[0], (s / max(s[0], 1e-300))**epsilon, 0.0)
    return (1 - alpha) * x + alpha * (u * grayed) @ vh


def layer_normed(batch, n, d, seed=0):
    """Tokens with zero channel mean, as a LayerNorm'd patch embedding makes: X 1 = 0, rank d - 1."""
    gen = torch.Generator().manual_seed(seed)
    return torch.nn.functional.layer_norm(torch.randn(batch, n, d, dtype=torch.float64, generator=gen), (d, ))


def assert_matches_reference(got, x, epsilon, alpha=1.0, rtol=1e-9):
    for b in range(x.shape[0]):
        want = numpy_graying(x[b].double().numpy(), epsilon, alpha)
        np.testing.assert_allclose(got[b].double().numpy(), want, atol=rtol * max(np.abs(want).max(), 1e-300))


@pytest.mark.parametrize('solver', SOLVERS)
@pytest.mark.parametrize('epsilon', [0.3, 0.95, 1.0])
@pytest.mark.parametrize('shape', STAGE_SHAPES + [(64, 512), (5, 3)])
def test_graying_matches_numpy_svd_reference(solver, epsilon, shape):
    x = random_tokens(2, *shape, 1e3, dtype=torch.float64)
    got = condition_tokens(x, mode='graying', epsilon=epsilon, solver=solver)
    assert_matches_reference(got, x, epsilon)
    # the paper's statement: kappa -> kappa^eps, and s_1 -> 1
    np.testing.assert_allclose(condition_number(got).numpy(), 1e3**epsilon, rtol=1e-6)
    np.testing.assert_allclose(torch.linalg.matrix_norm(got, ord=2).numpy(), 1.0, rtol=1e-9)


@pytest.mark.parametrize('solver', SOLVERS)
@pytest.mark.parametrize('dtype', [torch.float64, torch.float32])
def test_rank_deficient_tokens_keep_their_null_direction_at_zero(solver, dtype):
    # X 1 = 0: the map sends the zero singular value to 0 (it is not lifted, nothing is completed); both
    # methods, and the streaming Gram path that a float32 grid takes, agree with the reference
    x = layer_normed(2, 400, 24)
    grid = x.to(dtype).view(2, 20, 20, 24)
    got = condition_tokens(grid, mode='graying', epsilon=0.6, solver=solver).view(2, 400, 24)
    assert got.dtype == dtype and torch.isfinite(got).all()
    assert_matches_reference(got, x.to(dtype), 0.6, rtol=1e-9 if dtype == torch.float64 else 2e-5)
    ones = torch.ones(24, dtype=torch.float64)
    assert (got.double() @ ones).abs().max() < (1e-12 if dtype == torch.float64 else 1e-5)


@pytest.mark.parametrize('solver', SOLVERS)
@pytest.mark.parametrize('shape', [(400, 12), (12, 400)])
def test_singular_values_at_round_off_level_go_to_zero(solver, shape):
    # our choice where the paper is silent: s_i <= RANK_RTOL s_1 maps to 0, not to (s_i / s_1)^eps (here
    # (1e-6 / 3)^0.3 = 0.01); X's own component along such a direction is removed, not kept
    gen = torch.Generator().manual_seed(1)
    u, _ = torch.linalg.qr(torch.randn(max(shape), 12, dtype=torch.float64, generator=gen))
    v, _ = torch.linalg.qr(torch.randn(12, 12, dtype=torch.float64, generator=gen))
    s = torch.tensor([3.0, 2.0, 1.0, 0.5, 0.2, 0.1, 0.05, 0.02, 0.01, 5e-3, 1e-6, 1e-7], dtype=torch.float64)
    x = (u * s) @ v.T
    x = (x if shape[0] > shape[1] else x.T)[None]
    got = condition_tokens(x, mode='graying', epsilon=0.3, solver=solver)
    assert_matches_reference(got, x, 0.3)
    assert torch.linalg.matrix_rank(got[0], rtol=1e-9) == 10


@pytest.mark.parametrize('solver', SOLVERS)
def test_alpha_moves_part_of_the_way(solver):
    x = layer_normed(2, 300, 16)
    got = condition_tokens(x, mode='graying', epsilon=0.5, alpha=0.4, solver=solver)
    assert_matches_reference(got, x, 0.5, alpha=0.4)
    assert torch.equal(condition_tokens(x, mode='graying', alpha=0.0), x)


@pytest.mark.parametrize('solver', SOLVERS)
@pytest.mark.parametrize('scale', [1e-150, 1e-3, 1e150])
def test_graying_does_not_scale_with_the_tokens_and_extreme_scales_stay_finite(solver, scale):
    # U (S / s_1)^eps V^T is the same for X and c X; at 1e+-150 the Gram matrix would over/underflow
    x = random_tokens(2, 200, 16, 1e2, dtype=torch.float64)
    got = condition_tokens(x * scale, mode='graying', epsilon=0.8, solver=solver)
    assert torch.isfinite(got).all()
    assert_matches_reference(got, x, 0.8, rtol=1e-8)
    # the correction itself: C = (X + C) - X at that scale
    correction = token_correction(x * scale, mode='graying', epsilon=0.8, solver=solver)
    torch.testing.assert_close(correction, got - x * scale, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize('solver', SOLVERS)
@pytest.mark.parametrize('dtype', [torch.float64, torch.float32])
def test_degenerate_tokens_give_finite_results(solver, dtype):
    zero = torch.zeros(2, 50, 8, dtype=dtype)
    assert torch.equal(condition_tokens(zero, mode='graying', epsilon=0.3, solver=solver), zero)
    # rank 1: the single direction goes to singular value 1, the rest stays 0
    rank_one = torch.outer(torch.arange(1.0, 51.0), torch.linspace(-1, 1, 8)).to(dtype)[None]
    got = condition_tokens(rank_one, mode='graying', epsilon=0.3, solver=solver)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, rank_one / torch.linalg.matrix_norm(rank_one.double(), ord=2).to(dtype))
    # one token, one channel
    assert torch.equal(condition_tokens(torch.full((1, 1, 1), -3.0, dtype=dtype), mode='graying',
                                        solver=solver), torch.full((1, 1, 1), -1.0, dtype=dtype))


def test_gradient_through_graying_matches_finite_differences_and_stays_finite():
    x = random_tokens(1, 7, 4, 10, dtype=torch.float64).requires_grad_(True)
    torch.autograd.gradcheck(lambda t: condition_tokens(t, mode='graying', epsilon=0.6, detach=False), (x, ))
    rank_deficient = layer_normed(1, 30, 6).requires_grad_(True)
    condition_tokens(rank_deficient, mode='graying', epsilon=0.3, detach=False).square().sum().backward()
    assert torch.isfinite(rank_deficient.grad).all()



@pytest.mark.parametrize('scale', [1e-36, 1e-40, 1e-44])  # below the float32 floor, the last two subnormal
def test_graying_float32_tokens_far_below_any_real_scale_have_finite_gradients_of_the_shrunk_map(scale):
    # the map does not scale with X, so its slope grows as 1 / s_1: float32 tokens near 1e-40 had Inf gradients.
    # Below s_1 = 1 / (RANK_RTOL max) the map is multiplied by s_1 / that floor; the gradient is that map's, in
    # float64 autograd of its SVD formula, and both paths give its values
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(2, 20, 6, generator=gen, dtype=torch.float64) * scale).float()
    weight = torch.randn(2, 20, 6, generator=gen)
    floor = 1 / (RANK_RTOL * torch.finfo(torch.float32).max)

    def shrunk_map(t):
        u, s, vh = torch.linalg.svd(t, full_matrices=False)
        return (u * ((s / s[..., :1])**0.5 * (s[..., :1] / floor).clamp_max(1)).unsqueeze(-2)) @ vh

    x64 = x.double().requires_grad_(True)
    want = shrunk_map(x64)
    (want_grad, ) = torch.autograd.grad((want * weight.double()).sum(), x64)
    tokens = x.clone().requires_grad_(True)
    got = condition_tokens(tokens, mode='graying', epsilon=0.5, detach=False)
    (got_grad, ) = torch.autograd.grad((got * weight).sum(), tokens)
    assert torch.isfinite(got_grad).all()
    torch.testing.assert_close(got_grad.double(), want_grad, rtol=1e-4, atol=1e-4 * float(want_grad.abs().max()))
    for solver in SOLVERS:  # detach=True: the batched path and the reference, the same map
        torch.testing.assert_close(condition_tokens(x, mode='graying', epsilon=0.5, solver=solver).double(),
                                   want.detach(), rtol=1e-4, atol=1e-4 * float(want.abs().max()))


@pytest.mark.parametrize('window_size', [None, 4])
def test_each_image_is_grayed_on_its_valid_region_only(window_size):
    grid = layer_normed(2, 10 * 12, 16).view(2, 10, 12, 16)
    valid = [(10, 12), (7, 5)]
    out = condition_valid_regions(grid, valid, window_size=window_size, mode='graying', epsilon=0.6)
    torch.testing.assert_close(out[1, 7:], grid[1, 7:], rtol=0, atol=0)  # padding untouched
    torch.testing.assert_close(out[1, :7, 5:], grid[1, :7, 5:], rtol=0, atol=0)
    for image, (h, w) in enumerate(valid):
        region, tokens = out[image:image + 1, :h, :w], grid[image:image + 1, :h, :w]
        if window_size is None:
            assert_matches_reference(region.reshape(1, h * w, 16), tokens.reshape(1, h * w, 16), 0.6)
            continue
        for (top, left), window in window_matrices(tokens, window_size).items():
            assert_matches_reference(window_matrices(region, window_size)[top, left], window, 0.6)


def test_token_conditioner_window_scope_grays_each_window():
    conditioner = MODELS.build(dict(type='TokenConditioner', mode='graying', epsilon=0.3, scope='window',
                                    window_size=4))
    tokens = layer_normed(2, 8 * 8, 12)
    out = conditioner(tokens, hw_shape=(8, 8)).view(2, 8, 8, 12)
    for (top, left), window in window_matrices(tokens.view(2, 8, 8, 12), 4).items():
        assert_matches_reference(window_matrices(out, 4)[top, left], window, 0.3)
    assert 'epsilon=0.3' in repr(conditioner)
