"""The batched path's accuracy contract (solver 'eigh' or 'newton_schulz'; 'auto', the default, picks one), against
the float64 reference.

kappa(X + C) <= t (1 + KAPPA_TOL) at every rank; on full-rank inputs X + C is the reference's within
REFERENCE_TOL * TAU * kappa(X) (the canonical term rho E moves the small directions by about rho / s_min);
both solvers give the same X + C (SOLVER_TOL, REGION_SOLVER_TOL); it is continuous in X at every rank.
"""
import pytest
import torch

from condtok_mm.conditioning import (BOUNDING_MODES, ConditioningOptions, condition_number, condition_token_windows,
                                     condition_tokens, condition_valid_regions)
from condtok_mm.models.token_conditioner import TokenConditioner
from helpers.precision import low_precision_check
from helpers.tokens import random_tokens

KAPPA_TOL = 1e-4
# the documented rho = 1e-5 ||X||_F (condtok_mm.conditioning.batched.TAU), with a factor 3 of room
TAU = 1e-5
REFERENCE_TOL = 3.0
# the Newton-Schulz X + C against eigh's, relative to ||X + C||; and relative to ||C|| on regions of fewer tokens
# than channels (measured: 1.9e-5 at most, where eigh is 1.8e-5 from the SVD of u~ and Newton-Schulz 7e-6)
SOLVER_TOL = 1e-4
REGION_SOLVER_TOL = 5e-5


def embedded(n, rank, d=96, seed=0):
    return random_tokens(1, n, rank, 1e2, dtype=torch.float64, seed=seed) @ torch.linalg.qr(
        torch.randn(d, rank, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)))[0].T


INPUTS = {
    'layernorm': lambda: torch.nn.functional.layer_norm(torch.randn(2, 3136, 96), (96, )),
    'rank 49 of 96': lambda: embedded(4000, 49),
    'rank 49, n close to d': lambda: embedded(100, 49),
    'square, kappa 1e6': lambda: random_tokens(2, 96, 96, 1e6),
    'N < d': lambda: torch.randn(2, 49, 96),
    'N < d, layernorm': lambda: torch.nn.functional.layer_norm(torch.randn(2, 49, 96), (96, )),
    'N = 1': lambda: torch.randn(2, 1, 8),
    'constant': lambda: torch.ones(2, 50, 8),
    'rank one': lambda: torch.randn(2, 50, 1) @ torch.randn(2, 1, 8),
    'huge': lambda: torch.randn(2, 20, 4, dtype=torch.float64) * 1e200,
    'tiny': lambda: torch.randn(2, 20, 4, dtype=torch.float64) * 1e-200,
}


@pytest.mark.parametrize('solver', ['eigh', 'newton_schulz'])
@pytest.mark.parametrize('name', sorted(INPUTS))
def test_kappa_bound_holds_at_every_rank(name, solver):
    torch.manual_seed(0)
    x = INPUTS[name]()
    for mode in BOUNDING_MODES if solver == 'eigh' else ('sigma_max', ):
        y = condition_tokens(x, mode=mode, solver=solver)
        assert torch.isfinite(y).all() and y.dtype == x.dtype
        assert (condition_number(y) <= 2 * (1 + KAPPA_TOL)).all(), (name, mode, condition_number(y))


def test_zero_tokens_stay_zero():
    for solver in ('eigh', 'newton_schulz'):
        assert torch.equal(condition_tokens(torch.zeros(2, 50, 8), solver=solver), torch.zeros(2, 50, 8))


@pytest.mark.parametrize('mode', BOUNDING_MODES)
@pytest.mark.parametrize('kappa', [1e1, 1e2, 1e3])
def test_full_rank_tokens_match_the_reference_within_tau_kappa(mode, kappa):
    x = random_tokens(2, 3136, 96, kappa, dtype=torch.float64)
    want = condition_tokens(x, mode=mode, solver='reference_gram')
    for solver in ('eigh', 'newton_schulz') if mode == 'sigma_max' else ('eigh', ):
        got = condition_tokens(x, mode=mode, solver=solver)
        error = (got - want).flatten(1).norm(dim=1) / want.flatten(1).norm(dim=1)
        assert (error <= REFERENCE_TOL * TAU * kappa).all(), (solver, error)


@pytest.mark.parametrize('mode', BOUNDING_MODES)
def test_rank_deficient_singular_values_match_the_reference_within_rho(mode):
    x = embedded(4000, 49)
    rho = TAU * float(x.norm())
    want = torch.linalg.svdvals(condition_tokens(x, mode=mode, solver='reference_gram'))
    got = torch.linalg.svdvals(condition_tokens(x, mode=mode))
    assert float((got - want).abs().max()) <= 3 * rho + KAPPA_TOL * float(want.max())


@pytest.mark.parametrize('name', sorted(INPUTS))
def test_the_two_solvers_agree(name):
    torch.manual_seed(0)
    x = INPUTS[name]().double()
    eigh = condition_tokens(x, solver='eigh')
    newton_schulz = condition_tokens(x, solver='newton_schulz')
    scale = eigh.abs().flatten(1).amax(1).clamp_min(1e-300)[:, None, None]  # 1e200 tokens: norms overflow
    error = ((newton_schulz - eigh) / scale).flatten(1).norm(dim=1) / (eigh / scale).flatten(1).norm(dim=1)
    assert (error <= SOLVER_TOL).all(), error


def rank_deficient_regions(d, dtype):
    """A padded batch of token grids (5, H, W, d) whose valid regions hold fewer tokens than channels at several
    ranks (a row of d - 1 tokens at rank d / 2, which lifted the bound to 2.05 when Newton-Schulz took these
    from the d x d side, and at rank d - 2; a block at rank 1; a row at rank d / 2 - 1 whose token-side Gram matrix
    has an eigenvalue of 1e-15 of its largest at d = 96, where Newton-Schulz without its polar refinement step
    reached 2.0024) beside one full-rank region as tall as the grid."""
    height, width = 16, d
    regions = [(1, d - 1, d // 2, 0), (1, d - 1, d - 2, 1), (2, d // 4, 1, 2), (1, d - 1, d // 2 - 1, 10)]
    grid = torch.zeros(len(regions) + 1, height, width, d, dtype=torch.float64)
    for image, (h, w, rank, seed) in enumerate(regions):
        grid[image, :h, :w] = embedded(h * w, rank, d=d, seed=seed).reshape(h, w, d)
    grid[-1] = torch.randn(height, width, d, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    sizes = [(h, w) for h, w, _, _ in regions] + [(height, width)]
    return grid.to(dtype), sizes


@pytest.mark.parametrize('dtype', [torch.float32, torch.float64])
@pytest.mark.parametrize('d', [8, 96])
def test_rank_deficient_regions_with_fewer_tokens_than_channels_keep_the_bound_with_both_solvers(d, dtype):
    # A region of n < d tokens is conditioned from the token side (n x n, full rank) inside a grid whose other
    # regions take the d x d side: kappa <= t with either solver, and the two give the same X + C
    grid, sizes = rank_deficient_regions(d, dtype)
    out = {solver: condition_valid_regions(grid, sizes, solver=solver) for solver in ('eigh', 'newton_schulz')}
    for image, (h, w) in enumerate(sizes):
        region = {solver: y[image, :h, :w].reshape(1, h * w, d).double() for solver, y in out.items()}
        for solver, y in region.items():
            assert condition_number(y) <= 2 * (1 + KAPPA_TOL), (image, solver, condition_number(y))
        correction = region['eigh'] - grid[image, :h, :w].reshape(1, h * w, d).double()
        gap = (region['newton_schulz'] - region['eigh']).norm() / correction.norm()
        assert gap <= REGION_SOLVER_TOL, (image, gap)
        padding = torch.ones(grid.shape[1:3], dtype=torch.bool)
        padding[:h, :w] = False
        assert all(torch.equal(y[image][padding], grid[image][padding]) for y in out.values())


def test_independent_of_the_eigensolvers_signs(monkeypatch):
    # any sign of each eigenvector is a valid eigh result (LAPACK and cuSOLVER choose differently), and constant
    # tokens have a 7-fold repeated eigenvalue whose eigenvectors may be any rotation: X + C must not move
    x = torch.cat([torch.ones(1, 50, 8, dtype=torch.float64),
                   torch.nn.functional.layer_norm(torch.randn(1, 50, 8, dtype=torch.float64), (8, ))])
    want = condition_tokens(x, solver='eigh')
    eigh = torch.linalg.eigh
    gen = torch.Generator().manual_seed(0)

    def other_basis(a, *args, **kwargs):
        lam, vec = eigh(a, *args, **kwargs)
        signs = torch.where(torch.rand(vec.shape[-1], generator=gen) < 0.5, -1.0, 1.0).to(vec)
        return lam, vec * signs

    monkeypatch.setattr(torch.linalg, 'eigh', other_basis)
    torch.testing.assert_close(condition_tokens(x, solver='eigh'), want, rtol=0, atol=1e-12)


def test_continuous_at_constant_tokens():
    # the reference moves 54 % under a 1e-12 perturbation (its completion follows the new direction at once);
    # here the move stays at the round-off of the regularised Gram matrix (about eps / TAU^2 = 1e-6)
    x = torch.ones(1, 200, 16, dtype=torch.float64)
    noise = torch.randn(x.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    out = condition_tokens(x)
    moved = [float((condition_tokens(x + size * noise) - out).norm() / out.norm()) for size in (1e-12, 1e-14)]
    assert max(moved) < 1e-4, moved
    reference = condition_tokens(x, solver='reference_gram')
    moved = condition_tokens(x + 1e-12 * noise, solver='reference_gram')
    assert float((moved - reference).norm() / reference.norm()) > 0.1


def test_continuous_on_an_all_black_image_with_one_pixel_changed():
    # the demo Swin's patch embedding (4 x 4 x 3 -> 96, LayerNorm) on a 96 x 160 black image and the same image
    # with one pixel 1/255 brighter. The black image's tokens are all equal (rank one); the pixel adds a direction
    # with a singular value far above rho, whose lift then follows that direction: one direction of 96 moves
    # (about 1 / sqrt(96) of X + C), not the whole completion as on the reference (99.8 % on the demo Swin)
    torch.manual_seed(0)
    embed = torch.nn.Sequential(torch.nn.Conv2d(3, 96, 4, 4))
    norm = torch.nn.LayerNorm(96)
    image = torch.zeros(1, 3, 96, 160)
    other = image.clone()
    other[0, 1, 40, 70] = 1 / 255

    def tokens(img):
        with torch.no_grad():
            return norm(embed(img).flatten(2).transpose(1, 2))

    x, y = tokens(image), tokens(other)
    out_x = TokenConditioner()(x, hw_shape=(24, 40))
    out_y = TokenConditioner()(y, hw_shape=(24, 40))
    moved_in = float((y - x).norm() / x.norm())
    moved_out = float((out_y - out_x).norm() / out_x.norm())
    assert moved_out <= 2 / 96**0.5, (moved_in, moved_out)
    want_x = condition_tokens(x.view(1, 24, 40, 96), solver='reference_gram')
    want_y = condition_tokens(y.view(1, 24, 40, 96), solver='reference_gram')
    assert moved_out < float((want_y - want_x).norm() / want_x.norm()) / 2


def test_padded_batch_conditions_each_image_as_it_would_be_alone():
    torch.manual_seed(0)
    grid = torch.nn.functional.layer_norm(torch.randn(3, 12, 10, 16), (16, ))
    sizes = [(12, 10), (7, 9), (0, 3)]
    out = condition_valid_regions(grid, sizes)
    for image, (h, w) in enumerate(sizes):
        padding = torch.ones(12, 10, dtype=torch.bool)
        padding[:h, :w] = False
        assert torch.equal(out[image][padding], grid[image][padding])
        if h and w:
            alone = condition_tokens(grid[image:image + 1, :h, :w].contiguous())
            torch.testing.assert_close(out[image:image + 1, :h, :w], alone, rtol=1e-6, atol=1e-6)
            assert condition_number(out[image, :h, :w].reshape(1, -1, 16)) <= 2 * (1 + KAPPA_TOL)
    # the same with the sizes as a device tensor
    assert torch.equal(condition_valid_regions(grid, torch.tensor(sizes)), out)


@pytest.mark.parametrize('shift', [0, 2])
def test_windows_bound_kappa_per_window_and_pass_empty_windows(shift):
    torch.manual_seed(0)
    grid = torch.nn.functional.layer_norm(torch.randn(2, 9, 11, 16), (16, ))
    out = condition_valid_regions(grid, [(9, 11), (5, 6)], window_size=4, shift_size=shift)
    want = condition_valid_regions(grid, [(9, 11), (5, 6)], window_size=4, shift_size=shift, solver='reference_gram')
    # the reference conditions the same windows: the same tokens move and the same stay
    assert torch.equal(out == grid, want == grid)
    tops = [0] + list(range(shift or 4, 9, 4)) if shift else list(range(0, 9, 4))
    lefts = [0] + list(range(shift or 4, 11, 4)) if shift else list(range(0, 11, 4))
    for top in tops:
        for left in lefts:
            bottom = min(next((t for t in tops if t > top), 9), 9)
            right = min(next((c for c in lefts if c > left), 11), 11)
            window = out[0, top:bottom, left:right].reshape(1, -1, 16)
            assert condition_number(window) <= 2 * (1 + KAPPA_TOL), (top, left)
    flat = condition_token_windows(grid.reshape(2, 99, 16), (9, 11), 4, shift)
    torch.testing.assert_close(flat.view(2, 9, 11, 16)[0], out[0], rtol=0, atol=0)


def test_square_rank_deficient_windows_are_lifted_to_kappa_2_from_accurate_singular_values():
    # 16 LayerNorm'd tokens of 16 channels (rank 15): G~'s smallest eigenvalue, about rho^2 / n^2, is 1e-12 of its
    # largest, so sqrt(lambda) is off by ~1e-4 relative and the lift falls short (kappa 2.05 over these 300, any
    # CPU); the singular values from |u~ v| keep kappa at 2 to 4e-5
    torch.manual_seed(0)
    x = torch.nn.functional.layer_norm(torch.randn(300, 16, 16, dtype=torch.float64), (16, ))
    assert condition_number(condition_tokens(x)).max() <= 2 * (1 + KAPPA_TOL)


def test_alpha_scales_the_correction_linearly_and_zero_is_the_identity():
    x = torch.nn.functional.layer_norm(torch.randn(2, 500, 32, dtype=torch.float64), (32, ))
    assert torch.equal(condition_tokens(x, alpha=0.0), x)
    full = condition_tokens(x) - x
    torch.testing.assert_close(condition_tokens(x, alpha=0.25) - x, full / 4, rtol=1e-9, atol=1e-12)


def test_float16_overflow_names_half_precision():
    x = (torch.randn(1, 64, 16) * 1e4).half()
    assert torch.isfinite(x).all()
    with pytest.raises(ValueError, match='not finite although the tokens X are.*float16 .*65504.*bfloat16'):
        condition_tokens(x)
    with pytest.raises(ValueError, match='not finite although the tokens X are'):
        condition_tokens(x, solver='reference_gram')
    assert not torch.isfinite(condition_tokens(x, check=False)).all()  # check=False: no error, as asked
    assert torch.isfinite(condition_tokens(x.bfloat16())).all()


def test_non_finite_input_raises_at_once_on_the_cpu():
    x = torch.randn(2, 10, 4)
    x[1, 3, 2] = float('nan')
    with pytest.raises(ValueError, match='stage 0: the token matrix has 1 non-finite'):
        condition_tokens(x, where='stage 0')
    grid = torch.randn(2, 4, 5, 4)
    grid[0, 3, 4, 1] = float('inf')
    with pytest.raises(ValueError, match='non-finite'):
        condition_valid_regions(grid, [(4, 5), (2, 2)])
    assert torch.equal(condition_valid_regions(grid, [(3, 4), (2, 2)])[0, 3], grid[0, 3])  # padding is not read


@pytest.mark.parametrize('bad, message', [
    ([(4, 5), (-1, 2)], r'valid_shapes\[1\] must be a pair \(h, w\) of non-negative integers'),
    ([(4, 5), (2.0, 2)], r'valid_shapes\[1\] must be a pair \(h, w\) of non-negative integers'),
    ([(4, 5)], '1 valid_shapes for a batch of 2'),
    (torch.tensor([[4.0, 5.0], [2.0, 2.0]]), 'valid_shapes as a tensor must be integer'),
])
def test_bad_valid_shapes_are_refused_by_name(bad, message):
    with pytest.raises(ValueError, match=message):
        TokenConditioner()(torch.randn(2, 20, 4), hw_shape=(4, 5), valid_shapes=bad)


def test_alpha_is_validated_when_set_and_read_at_forward():
    conditioner = TokenConditioner()
    x = torch.nn.functional.layer_norm(torch.randn(1, 64, 8, dtype=torch.float64), (8, ))
    conditioner.alpha = 0.0
    assert torch.equal(conditioner(x), x)
    conditioner.alpha = 0.5
    torch.testing.assert_close(conditioner(x), condition_tokens(x, alpha=0.5), rtol=0, atol=0)
    with pytest.raises(ValueError, match=r'alpha=1e\+30 is invalid; use a number in \[0, 100\]'):
        conditioner.alpha = 1e30
    with pytest.raises(ValueError, match=r'target_kappa=inf is invalid'):
        TokenConditioner(target_kappa=float('inf'))


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
def test_low_precision_output_is_the_float64_result_rounded(dtype):
    x = random_tokens(2, 3136, 96, 1e6, dtype=dtype)
    y = condition_tokens(x, solver='newton_schulz')
    error, budget, kappa, kappa_bound = low_precision_check(x, y, 'sigma_max', solver='newton_schulz')
    assert (error <= budget).all() and (kappa <= kappa_bound).all(), (error, budget, kappa, kappa_bound)


@pytest.mark.parametrize('mode, solver', [('sigma_max', 'eigh'), ('sigma_max', 'newton_schulz'), ('floor', 'eigh'),
                                          ('graying', 'eigh')])
def test_fewer_tokens_than_channels_give_the_same_result_from_either_side(mode, solver):
    # A stack with fewer rows than channels is conditioned from the L x L side; the same matrix in a taller
    # stack (padding rows outside the mask) from the d x d stack, where a matrix of n < d valid tokens again takes
    # the token side (W W^T of its rows in order) and one of n >= d the channel side. They compute one function
    # (u~ h(u~^T u~) = h(u~ u~^T) u~), so an image does not change with the padding its batch-mates force.
    from condtok_mm.conditioning.batched import condition_masked
    options = ConditioningOptions(mode=mode, epsilon=0.5, solver=solver)
    tokens = torch.cat([embedded(40, 30, d=64, seed=1), 3 * embedded(40, 40, d=64, seed=2)]).double()
    wide_mask = torch.ones(2, 40, dtype=torch.bool)
    wide_mask[1, 33:] = False  # the second matrix has 33 valid tokens
    tall = torch.nn.functional.pad(tokens, (0, 0, 0, 60))
    tall_mask = torch.nn.functional.pad(wide_mask, (0, 60))
    wide, wide_status = condition_masked(tokens, wide_mask, options)
    padded, padded_status = condition_masked(tall, tall_mask, options)
    for b, n in enumerate((40, 33)):
        expected = padded[b, :n]
        assert torch.linalg.norm(wide[b, :n] - expected) <= 1e-6 * torch.linalg.norm(expected)
    assert wide_status.tolist() == padded_status.tolist() == [0, 0]


@pytest.mark.parametrize('length', [84, 67, 4200])  # a multiple of 64's divisors, a prime, a grid's H * W
def test_band_sums_and_spread_equal_the_dense_band_indicators(length):
    # Z^T u and Z W without forming Z (block sums, one partial block per edge, a gather by band) against the
    # indicator matrix Z written out: band j of a matrix holds its valid tokens floor(j n / m) .. floor((j+1) n / m)
    from condtok_mm.conditioning.batched import _Bands
    d, gen = 16, torch.Generator().manual_seed(0)
    mask = torch.rand(3, length, generator=gen) < 0.7
    mask[2] = False
    mask[2, :5] = True  # fewer valid tokens than channels: single-token bands
    u = torch.randn(3, length, d, dtype=torch.float64, generator=gen) * mask.unsqueeze(-1)
    dense = torch.zeros(3, length, d, dtype=torch.float64)
    for s in range(3):
        positions = mask[s].nonzero().flatten()
        n = len(positions)
        m = min(n, d)
        for j in range(m):
            members = positions[j * n // m:(j + 1) * n // m]
            dense[s, members, j] = 1 / len(members) ** 0.5
    bands = _Bands(mask, d)
    torch.testing.assert_close(bands.sums(u), dense.transpose(-1, -2) @ u, rtol=1e-12, atol=1e-12)
    rows = torch.randn(3, d, 5, dtype=torch.float64, generator=gen)
    torch.testing.assert_close(bands.spread(rows), dense @ rows, rtol=1e-12, atol=1e-12)
