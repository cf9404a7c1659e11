"""Token Graying's DCT form (mode='graying_dct'): equal to its float64 definition written with scipy's orthonormal
DCT-II, equal to the SVD form where the tokens' left singular vectors are DCT vectors, on the batched path's padded
grids (each image on its own valid region), and refused where it has no grid."""
import numpy as np
import pytest
import scipy.fft
import torch

import condtok_mm  # noqa: F401
from condtok_mm.conditioning import ConditioningOptions, condition_token_windows, condition_tokens, \
    condition_valid_regions
from condtok_mm.conditioning.modes import RANK_RTOL
from condtok_mm.registry import MODELS

SIZES = [(9, 11), (5, 7), (1, 3), (0, 0), (9, 1)]


def reference(region: np.ndarray, alpha: float, epsilon: float) -> np.ndarray:
    """The DCT form of one valid region (h, w, d) in float64, from scipy's orthonormal 2-D DCT-II."""
    if region.size == 0:
        return region
    coefficients = scipy.fft.dctn(region, type=2, norm='ortho', axes=(0, 1))
    norms = np.sqrt((coefficients**2).sum(-1))
    if norms.max() == 0:
        return (1 - alpha) * region
    live = norms > RANK_RTOL * norms.max()
    gain = np.where(live, (np.where(live, norms, 1) / norms.max())**epsilon / np.where(live, norms, 1), 0)
    return (1 - alpha) * region + alpha * scipy.fft.idctn(coefficients * gain[..., None], type=2, norm='ortho',
                                                            axes=(0, 1))


def padded_grids(dtype, seed=0, channels=6):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(len(SIZES), 9, 11, channels, generator=gen, dtype=torch.float64).to(dtype)


@pytest.mark.parametrize('dtype, tolerance', [(torch.float64, 1e-12), (torch.float32, 2e-6)])
@pytest.mark.parametrize('alpha, epsilon', [(1.0, 0.95), (0.7, 0.3)])
def test_equals_its_float64_definition_on_each_valid_region_and_leaves_the_padding(dtype, tolerance, alpha, epsilon):
    grids = padded_grids(dtype)
    out = condition_valid_regions(grids, SIZES, mode='graying_dct', alpha=alpha, epsilon=epsilon)
    assert out.dtype == dtype
    for image, (h, w) in enumerate(SIZES):
        expected = reference(grids[image, :h, :w].double().numpy(), alpha, epsilon)
        scale = max(np.abs(expected).max(), 1e-300) if expected.size else 1.0
        np.testing.assert_allclose(out[image, :h, :w].double().numpy(), expected, rtol=0, atol=tolerance * scale)
        padding = torch.ones(9, 11, dtype=torch.bool)
        padding[:h, :w] = False
        assert torch.equal(out[image][padding], grids[image][padding])


def test_every_token_valid_equals_its_definition_on_the_whole_grid():
    grid = padded_grids(torch.float64)[:2]
    out = condition_tokens(grid, mode='graying_dct', epsilon=0.5)
    for image in range(2):
        np.testing.assert_allclose(out[image].numpy(), reference(grid[image].numpy(), 1.0, 0.5), rtol=0, atol=1e-12)


def test_equals_the_svd_form_where_the_left_singular_vectors_are_dct_vectors():
    h, w, d = 6, 5, 4
    basis = scipy.fft.idctn(np.eye(h * w).reshape(h * w, h, w), type=2, norm='ortho', axes=(1, 2))  # basis images
    frequencies = [0, 3, 7, 12]
    v, _ = np.linalg.qr(np.random.default_rng(0).standard_normal((d, d)))
    tokens = (basis[frequencies].reshape(len(frequencies), -1).T * np.array([5.0, 2.0, 1.0, 0.01])) @ v.T
    grid = torch.from_numpy(tokens.reshape(1, h, w, d))
    dct_form = condition_tokens(grid, mode='graying_dct', epsilon=0.3)
    svd_form = condition_tokens(grid.reshape(1, h * w, d), mode='graying', epsilon=0.3, solver='reference_svd')
    torch.testing.assert_close(dct_form.reshape(1, h * w, d), svd_form, rtol=0, atol=1e-12)



@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16])
def test_autocast_leaves_the_float32_transforms_in_float32(dtype):
    # a mixed-precision training step runs the conditioner under autocast, which would run the float32 products in
    # its lower precision (1e-3 of ||C|| with bfloat16)
    grids = padded_grids(torch.float32, channels=32)
    want = condition_valid_regions(grids, SIZES, mode='graying_dct')
    with torch.autocast('cpu', dtype=dtype):
        got = condition_valid_regions(grids, SIZES, mode='graying_dct')
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_an_image_in_a_padded_batch_is_grayed_as_it_would_be_alone():
    grids = padded_grids(torch.float64)
    grids[1, 6:, 8:] = float('nan')  # whatever the padding holds (it is not part of the image) reaches nothing
    out = condition_valid_regions(grids, SIZES, mode='graying_dct')
    alone = condition_tokens(grids[1:2, :5, :7].contiguous(), mode='graying_dct')
    torch.testing.assert_close(out[1:2, :5, :7], alone, rtol=0, atol=1e-13)


def test_alpha_zero_is_the_identity_and_zero_or_constant_tokens_give_finite_results():
    grids = padded_grids(torch.float32)
    assert torch.equal(condition_valid_regions(grids, SIZES, mode='graying_dct', alpha=0.0), grids)
    zeros = torch.zeros(2, 4, 4, 3)
    assert torch.equal(condition_tokens(zeros, mode='graying_dct'), zeros)
    constant = torch.full((1, 4, 4, 3), 7.0)
    out = condition_tokens(constant, mode='graying_dct')
    # one frequency (the mean) carries everything: it is rescaled to norm 1 and stays constant
    torch.testing.assert_close(out, torch.full_like(constant, 1 / (4 * 3**0.5)))


def test_extreme_float64_magnitudes_give_finite_results_and_non_finite_tokens_raise():
    grids = padded_grids(torch.float64) * 1e200
    out = condition_valid_regions(grids, SIZES, mode='graying_dct')
    assert torch.isfinite(out).all()
    expected = reference(grids[0].numpy() / 1e200, 1.0, 0.95)  # the grayed map does not scale with X
    np.testing.assert_allclose(out[0].numpy(), expected, rtol=0, atol=1e-12)
    grids = padded_grids(torch.float32)
    grids[0, 2, 3, 1] = float('nan')
    with pytest.raises(ValueError, match='non-finite'):
        condition_valid_regions(grids, SIZES, mode='graying_dct')
    # unchecked (as on CUDA before a deferred check reads the status), that image comes back as it was
    out = condition_valid_regions(grids, SIZES, mode='graying_dct', check=False)
    torch.testing.assert_close(out[0], grids[0], equal_nan=True, rtol=0, atol=0)
    assert torch.equal(out[1:], condition_valid_regions(grids[1:], SIZES[1:], mode='graying_dct'))


def test_float16_tokens_are_grayed_in_float32_and_overflow_names_half_precision():
    grids = padded_grids(torch.float16)
    out = condition_valid_regions(grids, SIZES, mode='graying_dct', alpha=0.5)
    assert out.dtype == torch.float16
    expected = condition_valid_regions(grids.float(), SIZES, mode='graying_dct', alpha=0.5)
    torch.testing.assert_close(out.float(), expected.half().float(), rtol=0, atol=0)
    with pytest.raises(ValueError, match='float16 \\(half precision\\) holds values up to 65504'):
        condition_valid_regions((grids.float() * 1000).half(), SIZES, mode='graying_dct', alpha=100.0)  # -99 X


def test_centred_removes_nothing_along_the_ones_vector_and_equals_its_definition_on_the_complement():
    grids = padded_grids(torch.float64)
    out = condition_valid_regions(grids, SIZES, mode='graying_dct', epsilon=0.5, centred=True)
    correction = out - grids
    torch.testing.assert_close(correction.sum(-1), torch.zeros_like(correction[..., 0]), rtol=0, atol=1e-12)
    centred = grids - grids.mean(-1, keepdim=True)  # what the next LayerNorm lets through of the tokens
    for image, (h, w) in enumerate(SIZES):
        expected = reference(centred[image, :h, :w].numpy(), 1.0, 0.5)
        got = (out[image, :h, :w] - grids[image, :h, :w].mean(-1, keepdim=True)).numpy()
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12)


def test_the_correction_is_a_constant_in_backward():
    grid = padded_grids(torch.float64)[:2].requires_grad_()
    out = condition_tokens(grid, mode='graying_dct')
    weights = torch.randn_like(out)
    (out * weights).sum().backward()
    torch.testing.assert_close(grid.grad, weights)


def test_the_conditioner_grays_each_valid_region_as_the_functional_api_does():
    grids = padded_grids(torch.float32)
    conditioner = MODELS.build(dict(type='TokenConditioner', mode='graying_dct', epsilon=0.5))
    assert 'epsilon=0.5' in repr(conditioner)
    tokens = grids.reshape(len(SIZES), 9 * 11, -1)
    out = conditioner(tokens, hw_shape=(9, 11), valid_shapes=SIZES)
    assert torch.equal(out.view_as(grids), condition_valid_regions(grids, SIZES, mode='graying_dct', epsilon=0.5))


def test_refused_where_there_is_no_grid_or_no_reference_path():
    tokens = torch.randn(2, 12, 4)
    with pytest.raises(ValueError, match=r"mode='graying_dct' needs the token grid .*: pass token grids "
                                         r"\(B, H, W, d\), not \(2, 12, 4\)"):
        condition_tokens(tokens, mode='graying_dct')
    with pytest.raises(ValueError, match=r"mode='graying_dct' is invalid per attention window"):
        condition_token_windows(tokens, (3, 4), 2, mode='graying_dct')
    with pytest.raises(ValueError, match=r"mode='graying_dct' is invalid per attention window"):
        condition_valid_regions(tokens.view(2, 3, 4, 4), [(3, 4), (2, 2)], window_size=2, mode='graying_dct')
    with pytest.raises(ValueError, match=r"^condition_tokens: solver='reference_svd' is invalid; use 'auto' with "
                                         r"mode='graying_dct'"):
        ConditioningOptions(mode='graying_dct', solver='reference_svd')
    with pytest.raises(ValueError, match=r"^condition_tokens: detach=False is invalid; use True with "
                                         r"mode='graying_dct'"):
        ConditioningOptions(mode='graying_dct', detach=False)
    with pytest.raises(ValueError, match=r"^TokenConditioner: mode='graying_dct' is invalid per attention window"):
        MODELS.build(dict(type='TokenConditioner', mode='graying_dct', scope='window', window_size=7))
    conditioner = MODELS.build(dict(type='TokenConditioner', mode='graying_dct'))
    with pytest.raises(ValueError, match=r"^TokenConditioner: mode='graying_dct' needs the token grid .*: pass token "
                                         r'grids \(B, H, W, d\), not \(2, 12, 4\) \(to a TokenConditioner, the grid '
                                         r'hw_shape=\(H, W\)\)'):
        conditioner(tokens)
