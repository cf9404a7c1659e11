"""The conditioning's functional API (condition_tokens, token_correction): the bound, the modes and the
low-precision dtypes against numpy's float64 SVD."""
import numpy as np
import pytest
import torch

from condtok_mm.conditioning import (BOUNDING_MODES, ConditioningOptions, condition_number, condition_token_windows,
                                     condition_tokens, condition_valid_regions, token_correction)
from condtok_mm.conditioning.completion import _bands
from condtok_mm.conditioning.reference import _conditioned_grid_streaming, _correction_gram_tall
from helpers.precision import low_precision_check
from helpers.tokens import STAGE_SHAPES, random_tokens

SHAPES = STAGE_SHAPES + [(64, 512), (96, 96), (5, 3)]
KAPPAS = [1e1, 1e3, 1e6]
BOUND_TOL = 1e-3


def numpy_correction(x, mode, alpha=1.0, target_kappa=2.0):
    """Reference C for one float64 matrix from numpy's SVD."""
    u, s, vh = np.linalg.svd(x, full_matrices=False)
    if mode == 'sigma_max':
        lift = np.full_like(s, alpha * s[0] / (target_kappa - 1))
    else:
        lift = alpha * np.clip(s[0] / target_kappa - s, 0, None)
    return (u * lift) @ vh


@pytest.mark.parametrize('mode', BOUNDING_MODES)
@pytest.mark.parametrize('shape', SHAPES)
@pytest.mark.parametrize('kappa', KAPPAS)
def test_bound_holds_float32(mode, shape, kappa):
    x = random_tokens(2, *shape, kappa)
    assert torch.allclose(condition_number(x), torch.full((2, ), kappa, dtype=torch.float64), rtol=1e-2)
    y = condition_tokens(x, mode=mode)
    assert y.shape == x.shape and y.dtype == x.dtype
    assert (condition_number(y) <= 2 + BOUND_TOL).all()


@pytest.mark.slow
@pytest.mark.parametrize('mode', BOUNDING_MODES)
def test_bound_holds_at_detection_resolution(mode):
    # Swin-T tokens of an 800x1336 image: N = 200 * 334 = 66800, d = 96
    x = random_tokens(2, 66800, 96, 1e6)
    assert (condition_number(condition_tokens(x, mode=mode)) <= 2 + BOUND_TOL).all()


@pytest.mark.parametrize('mode', BOUNDING_MODES)
@pytest.mark.parametrize('shape', STAGE_SHAPES + [(64, 512)])
def test_matches_numpy_svd_reference(mode, shape):
    # the correction is unique for a full-rank X with distinct singular values
    x = random_tokens(2, *shape, 1e3, dtype=torch.float64)
    for solver in ('reference_gram', 'reference_svd'):
        got = token_correction(x, mode=mode, solver=solver)
        for b in range(2):
            want = numpy_correction(x[b].numpy(), mode)
            np.testing.assert_allclose(got[b].numpy(), want, atol=1e-9 * np.abs(want).max())


@pytest.mark.parametrize('mode', BOUNDING_MODES)
def test_target_kappa_and_alpha(mode):
    x = random_tokens(2, 500, 32, 1e4, dtype=torch.float64)
    assert (condition_number(condition_tokens(x, mode=mode, target_kappa=5.0)) <= 5 * (1 + 1e-6)).all()
    assert torch.equal(condition_tokens(x, mode=mode, alpha=0.0), x)
    half = condition_tokens(x, mode=mode, alpha=0.5) - x
    full = condition_tokens(x, mode=mode, alpha=1.0) - x
    torch.testing.assert_close(half, full / 2)


LOW_PRECISION_SHAPES = STAGE_SHAPES + [(64, 512)]


@pytest.mark.parametrize('mode', BOUNDING_MODES)
@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
@pytest.mark.parametrize('shape', LOW_PRECISION_SHAPES)
def test_low_precision_output_is_within_the_dtypes_rounding_of_the_bound(mode, dtype, shape):
    x = random_tokens(2, *shape, 1e6, dtype=dtype)
    y = condition_tokens(x, mode=mode, solver='reference_gram')  # the reference: checked against token_correction
    assert y.dtype == dtype and torch.isfinite(y).all()
    # In float64 (before the cast back) the bound holds as for float32 ...
    assert (condition_number(x.double() + token_correction(x.double(), mode=mode)) <= 2 + BOUND_TOL).all()
    # ... and the low-precision output is the float64 one rounded, with kappa as far above 2 as that allows.
    error, budget, kappa, kappa_bound = low_precision_check(x, y, mode)
    assert (error <= budget).all(), (error, budget)
    assert (kappa <= kappa_bound).all(), (kappa, kappa_bound)


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
@pytest.mark.parametrize('shape', LOW_PRECISION_SHAPES)
def test_low_precision_check_rejects_a_correction_short_of_the_bound(dtype, shape):
    # X + 0.6 C: kappa 1.6 s_1 / 0.6 s_1 = 2.67 in float64, close enough to 2 that a bound on the output
    # alone (Weyl with the measured distance to X + C) lets it pass; the rounding budget does not.
    x = random_tokens(2, *shape, 1e6, dtype=dtype)
    wrong = x + (0.6 * token_correction(x.double())).to(dtype)
    error, budget, kappa, kappa_bound = low_precision_check(x, wrong, 'sigma_max')
    assert (error > budget).all() and (kappa > kappa_bound).all(), (error, budget, kappa, kappa_bound)


@pytest.mark.parametrize('mode', BOUNDING_MODES)
def test_layernormed_tokens_are_rank_deficient_and_get_completed(mode):
    # LayerNorm makes every token zero-mean over channels: X 1 = 0, so X has a null direction
    x = torch.nn.functional.layer_norm(torch.randn(2, 3136, 96), (96, ))
    assert (condition_number(x) > 1e5).all()
    y = condition_tokens(x, mode=mode)
    assert (condition_number(y) <= 2 + BOUND_TOL).all()


def test_null_space_completion_falls_back_when_candidates_lie_in_range():
    # range(X) holds the indicators of the bands the Gram path completes from, so it cannot complete U
    x = torch.zeros(1, 64, 8, dtype=torch.float64)
    for j, (start, end) in enumerate(_bands(64, 6)):  # X has rank 6 of 8: 2 null directions, 6 bands
        x[0, start:end] = torch.randn(8, dtype=torch.float64)
    gram = x.transpose(-1, -2) @ x
    assert _correction_gram_tall(x, gram, ConditioningOptions()) is None  # the Gram path gives up ...
    y = condition_tokens(x, solver='reference_gram')
    assert torch.equal(y, condition_tokens(x, solver='reference_svd'))  # ... and the SVD computed the result
    assert condition_number(y) <= 2 + BOUND_TOL


@pytest.mark.parametrize('mode', BOUNDING_MODES)
@pytest.mark.parametrize(
    'name, x', [
        ('zeros', torch.zeros(2, 50, 8)),
        ('constant tokens', torch.ones(2, 50, 8)),
        ('rank one', torch.randn(2, 50, 1) @ torch.randn(2, 1, 8)),
        ('N < d', torch.randn(2, 3, 8)),
        ('N = 1', torch.randn(2, 1, 8)),
        ('square rank-deficient', torch.randn(1, 8, 6) @ torch.randn(1, 6, 8)),
        ('tiny', torch.randn(2, 20, 4, dtype=torch.float64) * 1e-200),
        ('huge', torch.randn(2, 20, 4, dtype=torch.float64) * 1e200),
    ])
def test_degenerate_inputs_give_finite_conditioned_output(mode, name, x):
    y = condition_tokens(x, mode=mode)
    assert torch.isfinite(y).all(), name
    kappa = condition_number(y)
    if name == 'zeros':  # nothing to condition: returned unchanged, kappa is infinite, not NaN
        assert torch.equal(y, x) and torch.isinf(kappa).all()
    else:
        assert (kappa <= 2 + BOUND_TOL).all(), (name, kappa)


@pytest.mark.parametrize('bad', [float('nan'), float('inf')])
@pytest.mark.parametrize('shape, dtype', [((2, 10, 4), torch.float32), ((2, 4, 10), torch.float32),
                                          ((2, 10, 4), torch.float64)], ids=['tall', 'wide', 'float64'])
@pytest.mark.parametrize('solver, alpha', [('reference_gram', 1.0), ('reference_svd', 1.0), ('reference_gram', 0.0)])
def test_non_finite_input_raises_with_location(bad, shape, dtype, solver, alpha):
    x = torch.randn(*shape, dtype=dtype)
    x[1, 3, 2] = bad
    with pytest.raises(ValueError, match=r'CondSwinTransformer stage 0: the token matrix has 1 non-finite'):
        condition_tokens(x, solver=solver, alpha=alpha, where='CondSwinTransformer stage 0')
    x.requires_grad_(True)  # the differentiable path (detach=False) checks as well
    with pytest.raises(ValueError, match=r'CondSwinTransformer stage 0: the token matrix has 1 non-finite'):
        condition_tokens(x, solver=solver, alpha=alpha, detach=False, where='CondSwinTransformer stage 0')


def test_tokens_of_the_wrong_shape_are_refused():
    with pytest.raises(ValueError, match=r'^condition_tokens: expected tokens of shape \(B, N, d\)'):
        condition_tokens(torch.randn(10))


def test_two_dimensional_input_and_empty_batch():
    x = random_tokens(1, 100, 16, 1e3)[0]
    y = condition_tokens(x)
    assert y.shape == x.shape and condition_number(y) <= 2 + BOUND_TOL
    empty = torch.zeros(0, 10, 4)
    assert condition_tokens(empty).shape == empty.shape


def test_detached_correction_passes_gradient_unchanged():
    x = torch.nn.functional.layer_norm(torch.randn(2, 300, 16), (16, )).requires_grad_()
    weight = torch.randn(2, 300, 16)
    (condition_tokens(x, detach=True) * weight).sum().backward()
    assert torch.equal(x.grad, weight)


@pytest.mark.parametrize('mode', BOUNDING_MODES)
def test_gradient_through_correction_matches_autograd_of_svd(mode):
    x = random_tokens(1, 30, 5, 10, dtype=torch.float64).requires_grad_()
    assert torch.autograd.gradcheck(lambda t: condition_tokens(t, mode=mode, detach=False), (x, ))

    def reference(t):
        u, s, vh = torch.linalg.svd(t, full_matrices=False)
        c = torch.from_numpy(numpy_correction(t[0].detach().numpy(), mode))  # value check
        if mode == 'sigma_max':
            lift = s[..., :1].expand_as(s)
        else:
            lift = (s[..., :1] / 2 - s).clamp_min(0)
        out = (u * lift.unsqueeze(-2)) @ vh
        torch.testing.assert_close(out[0].detach(), c)
        return t + out

    weight = torch.randn_like(x)
    ours, = torch.autograd.grad((condition_tokens(x, mode=mode, detach=False) * weight).sum(), x)
    theirs, = torch.autograd.grad((reference(x) * weight).sum(), x)
    torch.testing.assert_close(ours, theirs)



@pytest.mark.parametrize('mode', BOUNDING_MODES)
def test_detach_false_evaluates_the_function_it_trains(mode):
    # LayerNorm'd tokens are rank-deficient, where the batched path and the reference complete the null directions
    # differently (28 % of ||C|| apart here with sigma_max, 89 % with floor): the output must not depend on
    # whether the tokens require grad
    torch.manual_seed(0)
    grid = torch.nn.functional.layer_norm(torch.randn(2, 6, 7, 16, dtype=torch.float64), (16, ))
    calls = {
        'tokens': lambda t: condition_tokens(t, mode=mode, detach=False),
        'valid regions': lambda t: condition_valid_regions(t, [(6, 7), (4, 5)], mode=mode, detach=False),
        'windows': lambda t: condition_token_windows(t.flatten(1, 2), (6, 7), 4, 2, mode=mode, detach=False),
    }
    for name, call in calls.items():
        trained = call(grid.clone().requires_grad_())
        with torch.no_grad():
            evaluated = call(grid)
        torch.testing.assert_close(trained.detach(), evaluated, rtol=0, atol=1e-12, msg=name)


@pytest.mark.parametrize('mode', BOUNDING_MODES)
def test_gradient_stays_finite_on_rank_deficient_tokens(mode):
    x = torch.nn.functional.layer_norm(torch.randn(2, 300, 16), (16, )).requires_grad_()
    condition_tokens(x, mode=mode, detach=False).square().sum().backward()
    assert torch.isfinite(x.grad).all()
    z = torch.zeros(2, 10, 4, requires_grad=True)
    condition_tokens(z, mode=mode, detach=False).sum().backward()
    assert torch.isfinite(z.grad).all()


def test_condition_number_matches_numpy():
    x = torch.randn(3, 40, 7, dtype=torch.float64)
    expected = [np.linalg.cond(m) for m in x.numpy()]
    np.testing.assert_allclose(condition_number(x).numpy(), expected, rtol=1e-10)
    assert condition_number(x[0]).dim() == 0


def numpy_ones_complement(d):
    """An orthonormal (d, d - 1) basis of the complement of the all-ones vector, from numpy's SVD."""
    _, _, vh = np.linalg.svd(np.ones((1, d)))
    return vh[1:].T


@pytest.mark.parametrize('mode', BOUNDING_MODES)
@pytest.mark.parametrize('shape', STAGE_SHAPES[:1] + [(40, 64)])
def test_centred_variant_conditions_the_complement_of_the_ones_vector(mode, shape):
    # LayerNorm'd tokens (each token's channel mean 0, as Swin's patch embedding gives) plus a mean part
    x = torch.nn.functional.layer_norm(random_tokens(2, *shape, 1e3, dtype=torch.float64), shape[-1:])
    x = x + torch.randn(2, shape[0], 1, dtype=torch.float64)  # a channel-mean component per token
    got = condition_tokens(x, mode=mode, centred=True, solver='reference_gram') - x
    q = numpy_ones_complement(shape[1])
    for b in range(2):
        y = x[b].numpy() @ q
        want = numpy_correction(y, mode) @ q.T
        np.testing.assert_allclose(got[b].numpy(), want, atol=1e-9 * np.abs(want).max())
        np.testing.assert_allclose(got[b].numpy().sum(axis=1), 0, atol=1e-9 * np.abs(want).max())  # C 1 = 0
        assert np.linalg.cond((x[b] + got[b]).numpy() @ q) <= 2 + 1e-9
        # the channel mean of every token is kept
        np.testing.assert_allclose((x[b] + got[b]).numpy().mean(axis=1), x[b].numpy().mean(axis=1), atol=1e-12)


def test_centred_variant_of_layernormed_tokens_needs_no_completion_and_differs_from_the_plain_one():
    x = torch.nn.functional.layer_norm(random_tokens(1, 500, 32, 1e2), (32, ))
    plain, centred = condition_tokens(x), condition_tokens(x, centred=True)
    q = torch.from_numpy(numpy_ones_complement(32))
    # plain: kappa(X + C) <= 2 on all channels, but the lift along the ones vector is what norm1 removes
    assert condition_number(plain) <= 2 + BOUND_TOL
    assert condition_number(centred.double() @ q) <= 2 + BOUND_TOL
    assert condition_number(centred) > 1e3  # still rank-deficient along the ones vector: nothing lifted there
    assert (plain.double().sum(-1).abs().max() > 1e-2) and (centred.double().sum(-1).abs().max() < 1e-4)


def test_centred_gradient_matches_autograd_of_the_numpy_formula():
    torch.manual_seed(0)
    x = random_tokens(1, 30, 6, 1e2, dtype=torch.float64).requires_grad_(True)
    q = torch.from_numpy(numpy_ones_complement(6))
    out = condition_tokens(x, centred=True, detach=False)
    u, s, vh = torch.linalg.svd(x @ q, full_matrices=False)
    want = x + ((u * s[..., :1].unsqueeze(-2)) @ vh) @ q.T
    weights = torch.randn_like(x)
    (got_grad, ) = torch.autograd.grad((out * weights).sum(), x)
    (want_grad, ) = torch.autograd.grad((want * weights).sum(), x)
    torch.testing.assert_close(out, want.detach(), rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(got_grad, want_grad, rtol=1e-6, atol=1e-8)


def test_centred_variant_of_a_single_channel_is_the_identity():
    x = torch.randn(2, 10, 1)
    assert torch.equal(condition_tokens(x, centred=True), x)


@pytest.mark.parametrize('mode', BOUNDING_MODES)
@pytest.mark.parametrize('rank', [96, 95, 49, 20])
def test_gram_path_matches_the_svd_construction_on_rank_deficient_tokens(mode, rank):
    # the non-null part of X + C is unique; the null part is D_j u_j v_j^T with u_j orthonormal and
    # orthogonal to range(X): check exactly that, and the bound
    x = random_tokens(1, 4000, rank, 1e2, dtype=torch.float64) @ torch.linalg.qr(
        torch.randn(96, rank, dtype=torch.float64))[0].T  # rank 49: Swin-T's patch embedding
    out = condition_tokens(x, mode=mode, solver='reference_gram')
    u, s, vh = torch.linalg.svd(x[0], full_matrices=False)
    live = s > 1e-5 * s[0]
    lift = numpy_correction(x[0].numpy(), mode)  # LAPACK's completion for the null part
    v_live, v_null = vh[live].T, vh[~live].T
    np.testing.assert_allclose((out[0] @ v_live).numpy(), ((x[0] + torch.from_numpy(lift)) @ v_live).numpy(),
                               atol=1e-9 * s[0].item())
    completion = out[0] @ v_null  # N x k: the lifted null directions
    k = int((~live).sum())
    if k:
        gram = completion.T @ completion
        d_null = (s[0] / 1 if mode == 'sigma_max' else s[0] / 2).item()
        np.testing.assert_allclose(gram.numpy(), d_null ** 2 * np.eye(k), atol=1e-6 * d_null ** 2)
        np.testing.assert_allclose((u[:, live].T @ completion).numpy(), 0, atol=1e-6 * d_null)
    assert condition_number(out) <= 2 + BOUND_TOL


@pytest.mark.parametrize('mode', BOUNDING_MODES)
def test_wide_non_null_spectrum_with_null_directions_is_completed_with_two_projections(mode):
    x = torch.nn.functional.layer_norm(random_tokens(1, 3000, 32, 1e5, dtype=torch.float64), (32, ))
    out = condition_tokens(x, mode=mode)
    assert condition_number(out) <= 2 + BOUND_TOL
    q = torch.linalg.svd(x[0], full_matrices=False)[2][-1]  # the null direction: the ones vector
    np.testing.assert_allclose(abs(float(q.sum())) / np.sqrt(32), 1, rtol=1e-9)


@pytest.mark.parametrize('mode', BOUNDING_MODES)
@pytest.mark.parametrize('grid', [(60, 50), (3, 1000)])  # 60 rows: row bands; 3 rows < 51 bands: token runs
def test_streaming_grid_path_equals_the_explicit_one(mode, grid):
    # rank 49 of 96 like Swin-T's patch embedding: 47 null directions, completed on bands
    height, width = grid
    x = (random_tokens(1, height * width, 49, 1e2) @ torch.linalg.qr(torch.randn(96, 49))[0].T)
    out = torch.empty(1, height, width, 96)
    streamed = _conditioned_grid_streaming(x.view(1, height, width, 96), out, ConditioningOptions(mode=mode))
    assert streamed == (height >= 47 + 4)  # fewer rows than bands: the explicit path does it
    explicit = token_correction(x.double(), mode=mode, add_tokens=True, grid_width=width).float()
    got = condition_tokens(x.view(1, height, width, 96), mode=mode, solver='reference_gram')
    torch.testing.assert_close(got, explicit.view(1, height, width, 96), rtol=1e-5, atol=1e-5)
    if streamed:
        torch.testing.assert_close(out, got, rtol=0, atol=0)
    assert condition_number(got.view(1, -1, 96)) <= 2 + BOUND_TOL


def test_streaming_path_writes_into_a_strided_view_and_leaves_the_rest():
    x = torch.nn.functional.layer_norm(random_tokens(1, 30 * 40, 96, 1e2), (96, )).view(1, 30, 40, 96)
    out = torch.zeros(1, 32, 48, 96)
    assert _conditioned_grid_streaming(x[:, :, :35], out[:, :30, :35], ConditioningOptions())
    torch.testing.assert_close(out[:, :30, :35], condition_tokens(x[:, :, :35].contiguous(), solver='reference_gram'),
                               rtol=0, atol=0)
    assert out[:, 30:].abs().max() == 0 and out[:, :, 35:].abs().max() == 0


def test_grid_input_raises_on_non_finite_tokens_with_location():
    x = torch.randn(1, 20, 30, 8)
    x[0, 3, 4, 5] = float('nan')
    with pytest.raises(ValueError, match='CondX stage 0: the token matrix has 1 non-finite'):
        condition_tokens(x, where='CondX stage 0')
