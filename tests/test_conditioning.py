import numpy as np
import pytest
import torch

from condtok_mm import conditioning
from condtok_mm.conditioning import (CONDITIONING_MODES, _cosine_candidates, condition_number,
                                     condition_tokens, token_correction)
from conftest import random_tokens

SHAPES = [(3136, 96), (196, 768), (64, 512), (96, 96), (5, 3)]
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


@pytest.mark.parametrize('mode', CONDITIONING_MODES)
@pytest.mark.parametrize('shape', SHAPES)
@pytest.mark.parametrize('kappa', KAPPAS)
def test_bound_holds_float32(mode, shape, kappa):
    x = random_tokens(2, *shape, kappa)
    assert torch.allclose(condition_number(x), torch.full((2, ), kappa, dtype=torch.float64), rtol=1e-2)
    y = condition_tokens(x, mode=mode)
    assert y.shape == x.shape and y.dtype == x.dtype
    assert (condition_number(y) <= 2 + BOUND_TOL).all()


@pytest.mark.slow
@pytest.mark.parametrize('mode', CONDITIONING_MODES)
def test_bound_holds_at_detection_resolution(mode):
    # Swin-T tokens of an 800x1336 image: N = 200 * 334 = 66800, d = 96
    x = random_tokens(2, 66800, 96, 1e6)
    assert (condition_number(condition_tokens(x, mode=mode)) <= 2 + BOUND_TOL).all()


@pytest.mark.parametrize('mode', CONDITIONING_MODES)
@pytest.mark.parametrize('shape', [(3136, 96), (196, 768), (64, 512)])
def test_matches_numpy_svd_reference(mode, shape):
    # the correction is unique for a full-rank X with distinct singular values
    x = random_tokens(2, *shape, 1e3, dtype=torch.float64)
    for method in ('gram', 'svd'):
        got = token_correction(x, mode=mode, method=method)
        for b in range(2):
            want = numpy_correction(x[b].numpy(), mode)
            np.testing.assert_allclose(got[b].numpy(), want, atol=1e-9 * np.abs(want).max())


@pytest.mark.parametrize('mode', CONDITIONING_MODES)
def test_target_kappa_and_alpha(mode):
    x = random_tokens(2, 500, 32, 1e4, dtype=torch.float64)
    assert (condition_number(condition_tokens(x, mode=mode, target_kappa=5.0)) <= 5 * (1 + 1e-6)).all()
    assert torch.equal(condition_tokens(x, mode=mode, alpha=0.0), x)
    half = condition_tokens(x, mode=mode, alpha=0.5) - x
    full = condition_tokens(x, mode=mode, alpha=1.0) - x
    torch.testing.assert_close(half, full / 2)


def rounding_budget(value, dtype):
    """An upper bound, per matrix, on ||fl(V) - V||_2 when each entry of the float64 matrices V is rounded to
    ``dtype`` (round to nearest): an entry moves by at most u |v| (u = eps / 2, the unit roundoff) where ``dtype``
    represents it as a normal number and by at most u * tiny (half the subnormal spacing) below, so
    ||fl(V) - V||_2 <= ||fl(V) - V||_F <= u (||V||_F + tiny sqrt(#entries))."""
    info = torch.finfo(dtype)
    unit_roundoff = info.eps / 2
    entries = value.shape[-2] * value.shape[-1]
    return unit_roundoff * (torch.linalg.matrix_norm(value) + info.tiny * entries**0.5)


def low_precision_check(x, y, mode):
    """What the rounding to x.dtype allows for the output ``y`` of condition_tokens(x) in that dtype.

    The correction C is computed in float64 from X (exact in float64), cast to the dtype and added in the dtype:
    y = fl(X + fl(C)), two roundings, so y is within E = budget(C) + budget(X + fl(C)) of the exact X + C in
    spectral norm, and Weyl's inequality bounds kappa(y) <= (s_max + E) / (s_min - E) with s_max, s_min of the
    exact X + C. Returns (||y - (X + C)||_2, E, kappa(y), that bound), one value per matrix.
    """
    x64 = x.double()
    correction = token_correction(x64, mode=mode)
    exact = x64 + correction
    budget = (rounding_budget(correction, x.dtype)
              + rounding_budget(x64 + correction.to(x.dtype).double(), x.dtype))
    s = torch.linalg.svdvals(exact)
    error = torch.linalg.matrix_norm(y.double() - exact, ord=2)
    return error, budget, condition_number(y), (s[:, 0] + budget) / (s[:, -1] - budget)


LOW_PRECISION_SHAPES = [(3136, 96), (196, 768), (64, 512)]


@pytest.mark.parametrize('mode', CONDITIONING_MODES)
@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
@pytest.mark.parametrize('shape', LOW_PRECISION_SHAPES)
def test_low_precision_output_is_within_the_dtypes_rounding_of_the_bound(mode, dtype, shape):
    x = random_tokens(2, *shape, 1e6, dtype=dtype)
    y = condition_tokens(x, mode=mode)
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


@pytest.mark.parametrize('mode', CONDITIONING_MODES)
def test_layernormed_tokens_are_rank_deficient_and_get_completed(mode):
    # LayerNorm makes every token zero-mean over channels: X 1 = 0, so X has a null direction
    x = torch.nn.functional.layer_norm(torch.randn(2, 3136, 96), (96, ))
    assert (condition_number(x) > 1e5).all()
    y = condition_tokens(x, mode=mode)
    assert (condition_number(y) <= 2 + BOUND_TOL).all()


def test_null_space_completion_falls_back_to_the_svd_when_candidates_lie_in_range(monkeypatch):
    # range(X) holds the first six cosine candidates, so the Gram path cannot complete U from them
    cand = _cosine_candidates(64, 8, torch.float64, torch.device('cpu'))
    x = (cand[:, :6] @ torch.randn(6, 8, dtype=torch.float64)).unsqueeze(0)
    completions, complete_null_space = [], conditioning._complete_null_space

    def recorded_completion(*args):
        completions.append(complete_null_space(*args))
        return completions[-1]

    monkeypatch.setattr(conditioning, '_complete_null_space', recorded_completion)
    y = condition_tokens(x)
    monkeypatch.undo()
    assert completions and all(c is None for c in completions)  # the Gram path tried and gave up ...
    assert torch.equal(y, condition_tokens(x, method='svd'))  # ... and the SVD path computed the result
    assert condition_number(y) <= 2 + BOUND_TOL


@pytest.mark.parametrize('mode', CONDITIONING_MODES)
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
@pytest.mark.parametrize('method, alpha', [('gram', 1.0), ('svd', 1.0), ('gram', 0.0)])
def test_non_finite_input_raises_with_location(bad, shape, dtype, method, alpha):
    x = torch.randn(*shape, dtype=dtype)
    x[1, 3, 2] = bad
    with pytest.raises(ValueError, match=r'CondSwinTransformer stage 0: the token matrix has 1 non-finite'):
        condition_tokens(x, method=method, alpha=alpha, where='CondSwinTransformer stage 0')
    x.requires_grad_(True)  # the differentiable path (detach=False) checks as well
    with pytest.raises(ValueError, match=r'CondSwinTransformer stage 0: the token matrix has 1 non-finite'):
        condition_tokens(x, method=method, alpha=alpha, detach=False, where='CondSwinTransformer stage 0')


def test_invalid_arguments_list_valid_values():
    x = torch.randn(10, 4)
    with pytest.raises(ValueError, match="one of \\('sigma_max', 'floor'\\)"):
        condition_tokens(x, mode='max')
    with pytest.raises(ValueError, match='> 1'):
        condition_tokens(x, target_kappa=1.0)
    with pytest.raises(ValueError, match='>= 0'):
        condition_tokens(x, alpha=-1)
    with pytest.raises(ValueError, match='shape'):
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


@pytest.mark.parametrize('mode', CONDITIONING_MODES)
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


@pytest.mark.parametrize('mode', CONDITIONING_MODES)
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
