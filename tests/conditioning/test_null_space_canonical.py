"""The reference Gram path's (solver='reference_gram') null-space completion does not depend on the eigensolver's
choice of bases.

torch.linalg.eigh returns an arbitrary orthonormal basis of a repeated eigenvalue's eigenspace (signs for a
simple one, any rotation for a multiple one), and LAPACK (CPU) and cuSOLVER (CUDA) choose differently; the
null space of a rank-deficient token matrix is such an eigenspace (eigenvalue 0). These tests make eigh
return other, equally valid bases and check that X + C stays the same.
"""
import pytest
import torch

from condtok_mm.conditioning import completion, reference
from condtok_mm.conditioning import BOUNDING_MODES, RANK_RTOL, condition_number, condition_tokens
from helpers.tokens import random_tokens

BOUND_TOL = 1e-3


def scrambled(eigh, null_sign, other_sign):
    """eigh returning another valid eigenbasis: the eigenvectors whose eigenvalues are at round-off level (the
    null space of a Gram matrix; what the Gram path treats as null) times ``null_sign`` and, if that is -1,
    a fixed random rotation among them; all the others times ``other_sign``."""

    def wrapper(a, *args, **kwargs):
        lam, vec = eigh(a, *args, **kwargs)
        n = lam.shape[-1]
        flat_lam, flat_vec = lam.reshape(-1, n), vec.reshape(-1, n, n).clone()
        gen = torch.Generator().manual_seed(n)
        for b in range(flat_lam.shape[0]):
            s = flat_lam[b].clamp_min(0).sqrt()
            null = (s <= RANK_RTOL * s[-1]).nonzero().flatten()
            signs = torch.full((n, ), float(other_sign), dtype=vec.dtype)
            signs[null] = null_sign
            flat_vec[b] *= signs.to(vec.device)
            if null_sign == -1 and len(null) >= 2:
                rotation = torch.linalg.qr(torch.randn(len(null), len(null), dtype=vec.dtype, generator=gen))[0]
                flat_vec[b][:, null] = flat_vec[b][:, null] @ rotation.to(vec.device)
        return lam, flat_vec.view(vec.shape)

    return wrapper


@pytest.fixture
def calls(monkeypatch):
    """What the Gram path's helpers returned (None/False: they handed the work on) and whether the SVD ran."""
    record = {}

    def spy(name):
        function = getattr(reference, name)

        def wrapper(*args, **kwargs):
            result = function(*args, **kwargs)
            record.setdefault(name, []).append(result is not None and result is not False)
            return result

        monkeypatch.setattr(reference, name, wrapper)

    for name in ('_conditioned_grid_streaming', '_completion_lift', '_complete_null_space', '_correction_svd'):
        spy(name)
    return record


def unchanged_under_other_eigenbases(monkeypatch, x, **kwargs):
    """condition_tokens(x) with eigh as it is and with :func:`scrambled` eighs: they agree to round-off."""
    kwargs.setdefault('solver', 'reference_gram')
    expected = condition_tokens(x, **kwargs)
    # the null space's basis (V side) and the completion's eigenvectors (U side) changed one at a time
    for null_sign, other_sign in ((-1, 1), (1, -1)):
        with monkeypatch.context() as patch:
            patch.setattr(torch.linalg, 'eigh', scrambled(torch.linalg.eigh, null_sign, other_sign))
            other = condition_tokens(x, **kwargs)
        torch.testing.assert_close(other, expected, rtol=0, atol=1e-10 * float(expected.abs().max()),
                                   msg=lambda m: f'null_sign={null_sign}, other_sign={other_sign}: {m}')
    return expected


def embedded(ranks, n, d, kappa, seed=0):
    """(B, n, d) float64 tokens, sample b of rank ranks[b] (d - ranks[b] null directions)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.cat([random_tokens(1, n, r, kappa, dtype=torch.float64, seed=seed + b)
                      @ torch.linalg.qr(torch.randn(d, r, dtype=torch.float64, generator=gen))[0].T
                      for b, r in enumerate(ranks)])


def null_counts(x):
    s = torch.linalg.svdvals(x)
    return [int(c) for c in (s <= RANK_RTOL * s[..., :1]).sum(-1)]


@pytest.mark.parametrize('mode', BOUNDING_MODES)
def test_layernormed_window_streaming(monkeypatch, calls, mode):
    # one null direction (the ones vector) per 7 x 7 window of 48 channels, as in the CUDA/CPU mismatch
    x = torch.nn.functional.layer_norm(torch.randn(4, 49, 48, dtype=torch.float64), (48, ))
    assert null_counts(x) == [1] * 4
    out = unchanged_under_other_eigenbases(monkeypatch, x, mode=mode)
    assert all(calls['_conditioned_grid_streaming']) and '_correction_svd' not in calls
    assert (condition_number(out) <= 2 + BOUND_TOL).all()


@pytest.mark.parametrize('mode', BOUNDING_MODES)
def test_mixed_null_counts_streaming(monkeypatch, calls, mode):
    x = embedded([40, 44, 47, 48], 49, 48, 1e2)
    assert null_counts(x) == [8, 4, 1, 0]
    out = unchanged_under_other_eigenbases(monkeypatch, x, mode=mode)
    assert all(calls['_conditioned_grid_streaming']) and '_correction_svd' not in calls
    assert (condition_number(out) <= 2 + BOUND_TOL).all()


@pytest.mark.parametrize('mode', BOUNDING_MODES)
@pytest.mark.slow
def test_mixed_null_counts_explicit_single_projection(monkeypatch, calls, mode):
    # a 7 x 7 grid has fewer rows than the 12 bands: not streamed, completed by _completion_lift on token runs
    x = embedded([40, 44, 47, 48], 49, 48, 1e2)
    out = unchanged_under_other_eigenbases(monkeypatch, x.view(4, 7, 7, 48), mode=mode)
    assert not any(calls['_conditioned_grid_streaming']) and all(calls['_completion_lift'])
    assert '_correction_svd' not in calls
    assert (condition_number(out.view(4, 49, 48)) <= 2 + BOUND_TOL).all()


@pytest.mark.parametrize('mode', BOUNDING_MODES)
@pytest.mark.parametrize('layernorm', [True, False])
@pytest.mark.slow
def test_wide_spectrum_explicit_two_projections(monkeypatch, calls, mode, layernorm):
    # a non-null spectrum wider than kappa 1e3 beside null directions: _complete_null_space does the work
    if layernorm:
        x = torch.nn.functional.layer_norm(random_tokens(2, 600, 32, 1e4, dtype=torch.float64), (32, ))
        assert null_counts(x) == [1, 1]
    else:
        x = embedded([25, 31, 28], 600, 32, 1e4)
        assert null_counts(x) == [7, 1, 4]
    out = unchanged_under_other_eigenbases(monkeypatch, x, mode=mode)
    assert all(calls['_complete_null_space']) and '_correction_svd' not in calls
    assert (condition_number(out) <= 2 + BOUND_TOL).all()


@pytest.mark.parametrize('mode', BOUNDING_MODES)
def test_wide_token_matrix(monkeypatch, calls, mode):
    # N < d (a window cut by the border): the construction runs on X^T, the null space is in token space
    x = embedded([15, 21, 18], 48, 21, 1e2).transpose(-1, -2).contiguous()  # (3, 21, 48), ranks 15, 21, 18
    assert x.shape == (3, 21, 48)
    out = unchanged_under_other_eigenbases(monkeypatch, x, mode=mode)
    assert all(calls['_completion_lift']) and '_correction_svd' not in calls
    assert (condition_number(out) <= 2 + BOUND_TOL).all()


def test_layernorm_null_direction_is_lifted_along_plus_ones():
    # V_0 is rotated towards the first DCT vector, the (positive) ones vector: the lift is along +1, and u_0
    # has a positive overlap with the first band of tokens
    x = torch.nn.functional.layer_norm(torch.randn(3, 49, 48, dtype=torch.float64), (48, ))
    out = condition_tokens(x, solver='reference_gram')
    lifted = out @ torch.full((48, ), 48 ** -0.5, dtype=torch.float64)  # (X + C) 1/sqrt(d) = D u_0
    s1 = torch.linalg.svdvals(x)[:, 0]
    torch.testing.assert_close(lifted.norm(dim=-1), s1, rtol=1e-9, atol=0)  # sigma_max: D = s_1 / (t - 1)
    first_band = completion._bands(49, 5)[0]
    assert (lifted[:, first_band[0]:first_band[1]].sum(-1) > 0).all()
