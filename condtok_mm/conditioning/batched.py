"""The batched path: one masked program for every token matrix of a padded batch (or every window of it).

Each of the S matrices of a stack ``x`` (S, L, d) is the set of its tokens where ``mask`` (S, L) is True, in
their row-major order; n_s of them. No Python loop runs over images, windows or bands, nothing reads a value
back to the host, and the shapes do not depend on the data: the same launches for any valid sizes.

Regularised spectral function (modes 'sigma_max' and 'floor'). With u the valid tokens (n x d, float64),
rho = TAU ||u||_F and the fixed canonical n x d matrix E = Z F^T (Z: normalised indicators of m = min(n, d) runs
of consecutive valid tokens, F: the first m orthonormal DCT-II vectors of R^d; E has orthonormal columns when
n >= d and orthonormal rows when n < d),

    u~ = u + rho E,   G~ = u~^T u~ = G + rho (u^T Z F^T + F Z^T u) + rho^2 F_m F_m^T,
    X + C = X + alpha (u~ (I + M) - u),   M = h(G~),

with h the spectral function of the mode evaluated at the eigenvalues lambda of G~ shifted by delta = SHIFT rho^2:
sigma_max h = c / sqrt(lambda + delta), c = s~_1 / (t - 1) and s~_1 an upper bound on the largest singular value
of u~; floor h = max(s~_1 / t - s, 0) / s, s = sqrt(lambda + delta).
u~ has full rank for every token matrix short of a measure-zero set, so h(G~) is unique whatever basis an
eigensolver picks (the result does not depend on the solver or the device) and continuous in X at every rank
(constant tokens, an all-black image: rho -> 0 with X, no rank threshold, no completion). Where n < d, G~ has
d - n zero eigenvalues by structure, which no solver sees: the d x d matrix handed to it is then the token side's
W W^T, W = Z^T u + rho F_m^T (u~'s rows in order, zero rows below n, whose diagonal gets rho^2), and
u~ (I + M) = u~ + h(W W^T) W, since u~ h(u~^T u~) = h(u~ u~^T) u~ (see :func:`regularised_function`). Z^T u and
Z F^T (I + M) cost O(N d): prefix sums at the band edges and a gather by band (no atomics: deterministic).

Solvers. 'eigh': one batched eigh of the (S, d, d) stack (LAPACK on the CPU, exact and cheap; on CUDA cuSOLVER
loops over the stack and reads its error info back: one host sync per call, not per image); on stacks of at most
ACCURATE_ROWS x d rows, and on the token side of every stack (n < d: W^T V is one d x d product), the singular
values are the column norms of u~ V, not sqrt(lambda). 'newton_schulz'
(sigma_max only): s~_1 from trace powers (:func:`.matrix_functions.largest_eigenvalue_bound`, an upper bound, so
kappa(X + C) <= t holds by construction) and (G~ + delta I)^(-1/2) from a fixed number of coupled Newton-Schulz
steps: matmuls only, no host sync, capturable in a CUDA graph.

'graying' is a spectral function of G itself (no regularisation: it maps the null directions to 0): one batched
eigh, X + C = X V diag((1 - alpha) + alpha g(s) / s) V^T.
"""

import math
from typing import Optional

import torch

from .completion import _channel_candidates
from .diagnostics import BAD_INPUT, BAD_OUTPUT, FINE
from .matrix_functions import (inverse_sqrt_newton_schulz, largest_eigenvalue_bound, newton_schulz_schedule,
                               polar_refinement_step)
from .modes import _grayed, graying_floor

# rho = TAU ||X||_F: the size of the canonical term that makes every token matrix full rank.
TAU = 1e-5
# delta = SHIFT rho^2 only keeps h finite: the matrix a solver sees has full rank (G~ where n >= d, the token side's
# W W^T where n < d). G~ itself would have d - n zero eigenvalues by structure where n < d, whose round-off (about
# eps lambda_max) a shift would have to hide, and a shift that large (1e-4 rho^2) left the true eigenvalues below it
# short of their lift: where u is rank-deficient those of u~ can lie far below rho^2 (2.5e-3 rho^2 on a random rank
# 47 row of 95 tokens of 96 channels), and kappa reached 2.05 there. The smallest eigenvalues can lie well below
# rho^2 on either side (a square X: about rho^2 / n^2).
SHIFT = 1e-10
# Stacks of at most ACCURATE_ROWS x d token rows (windows, small images) take their singular values from u~ V rather
# than from the eigenvalues (one more L x d x d product: cheap there, and where n is close to d the smallest
# eigenvalue of G~, about rho^2 / n^2, is below eigh's resolution eps s_1^2 relative to it); taller stacks have
# eigenvalues of at least about rho^2, resolved to eps / TAU^2 = 2e-6, and skip the product. The choice follows the
# padded length, so an image alone and in a padded batch can differ by that resolution (far below float32's): the
# price of keeping the product off large images.
ACCURATE_ROWS = 4
# Newton-Schulz steps to converge every eigenvalue >= delta / lambda_max >= SHIFT TAU^2 (||X||_F >= s_1).
_NEWTON_SCHULZ_STEPS = newton_schulz_schedule(SHIFT * TAU**2)


def resolve_solver(solver: str, mode: str, device: torch.device) -> str:
    """'auto' -> 'newton_schulz' for sigma_max on CUDA, 'eigh' otherwise.

    Measured on an H200 with torch 2.11 (docs/en/benchmarks.md, tools/benchmark/conditioner_cost.py --device cuda):
    Newton-Schulz is the only solver without a host sync (cuSOLVER's eigh reads its error codes back), so the only
    one a CUDA graph captures and the only one that exports; it was faster at ViTDet-B's size (64 x 64 tokens, d 768)
    and as fast at Swin-T's (200 x 336, d 96) in eager mode, where compiled eigh was faster. torch 2.11 predates
    torch 2.12's batched CUDA eigh (up to 100x faster above 32 x 32): on torch >= 2.12, where host syncs do not
    matter, solver='eigh' may be the faster choice; measure it with that script."""
    if solver != 'auto':
        return solver
    return 'newton_schulz' if mode == 'sigma_max' and device.type == 'cuda' else 'eigh'


def _block_length(length: int) -> int:
    """The largest divisor of ``length`` up to 64: the block of the band sums (prefix sums run inside each block and
    then over the block sums, so that neither runs along all L positions)."""
    return max(b for b in range(1, min(length, 64) + 1) if length % b == 0)


class _Bands:
    """The bands j < m = min(n, d) of every stack entry: runs of floor((j+1) n / m) - floor(j n / m) consecutive
    valid tokens (a token outside the mask is in no band), as Z, the normalised band indicators.

    Z is never formed (an (S, L, d) float64 matrix, and two more N x d x d products): Z^T u is the difference of the
    prefix sums of u at the band edges (:meth:`sums`: prefix sums inside blocks, their running sum over the blocks,
    and one row gathered per edge: one read and one write of u, no buffer beyond it) and Z W gives every token its
    band's row of W (:meth:`spread`: one index_select), O(N d) each, deterministic (no atomics), the same launches
    for any valid sizes.
    """

    def __init__(self, mask: torch.Tensor, d: int):
        count = mask.cumsum(-1)  # valid tokens up to and including each position, non-decreasing
        n = count[:, -1:]
        m = n.clamp(max=d)
        n_safe, m_safe = n.clamp(min=1), m.clamp(min=1)
        j = torch.arange(d + 1, device=mask.device)
        edges = (torch.minimum(j, m) * n).div(m_safe, rounding_mode='floor')  # (S, d + 1), in valid tokens
        self.live = j[:-1] < m  # (S, d): which bands exist
        lengths = (edges[:, 1:] - edges[:, :-1]).clamp(min=1).to(torch.float64)  # sqrt of an integer tensor is float32
        self.weight = self.live / lengths.sqrt()
        # positions whose count is <= each edge: the first e valid tokens lie in the first `ends` positions
        self.ends = torch.searchsorted(count.contiguous(), edges.contiguous(), right=True)  # (S, d + 1)
        band = torch.where(mask, (count * m - 1).div(n_safe, rounding_mode='floor'), d)  # (S, L); d: no band
        stack = mask.shape[0]
        self.rows = (band + (d + 1) * torch.arange(stack, device=mask.device).unsqueeze(-1)).reshape(-1)

    def sums(self, u: torch.Tensor) -> torch.Tensor:
        """Z^T u (S, d bands, channels) for u (S, L, channels), zero outside the mask."""
        stack, length, channels = u.shape
        block = _block_length(length)
        num_blocks = length // block
        within = u.view(stack, num_blocks, block, channels).cumsum(2)  # prefix sums inside each block
        before = torch.nn.functional.pad(within[:, :, -1].cumsum(1), (0, 0, 1, 0))  # sums of the blocks before k
        index = (self.ends // block).clamp(max=num_blocks - 1)  # (S, d + 1): the block each edge ends in
        rest = self.ends - index * block  # the positions of that block before the edge, 0..block
        offsets = torch.arange(stack, device=u.device).unsqueeze(-1)
        rows = (index + (num_blocks + 1) * offsets).reshape(-1)
        last = ((index + num_blocks * offsets) * block + (rest - 1).clamp(min=0)).reshape(-1)
        head = within.reshape(-1, channels).index_select(0, last).view(stack, -1, channels) \
            * (rest > 0).unsqueeze(-1)  # the sum of the first `rest` positions of that block
        prefix = before.reshape(-1, channels).index_select(0, rows).view(stack, -1, channels) + head
        return (prefix[:, 1:] - prefix[:, :-1]) * self.weight.unsqueeze(-1)

    def spread(self, rows: torch.Tensor) -> torch.Tensor:
        """Z W (S, L, channels) for W (S, d bands, channels): every token gets its band's row (zero: none)."""
        stack, bands, channels = rows.shape
        weighted = torch.nn.functional.pad(rows * self.weight.unsqueeze(-1), (0, 0, 0, 1))  # row d: no band
        return weighted.reshape(-1, channels).index_select(0, self.rows).view(stack, -1, channels)


def condition_masked(x: torch.Tensor, mask: torch.Tensor, options):
    """X + C (float64 (S, L, d), zero outside ``mask``) and the status (S,) of each matrix (FINE, BAD_INPUT where X
    has NaN/Inf, BAD_OUTPUT where X + C overflows x's dtype), for the mode, alpha, target_kappa, epsilon and solver
    ('auto', 'eigh' or 'newton_schulz', see the module) of ``options`` (a :class:`.options.ConditioningOptions`).
    The caller puts the tokens outside the mask back."""
    stack, length_tokens, d = x.shape
    # a cast and an in-place fill, not one promoting where: that moves fewer bytes (3 passes over X instead of 7) but
    # runs at half their speed on the CPU
    masked = x.to(torch.float64, copy=True).masked_fill_(~mask.unsqueeze(-1), 0)
    u, scale = masked, None
    if x.dtype == torch.float64:  # squares of float32/16 values cannot overflow or underflow in float64
        scale = torch.linalg.vector_norm(masked, ord=math.inf, dim=(1, 2))
        scale = torch.where((scale > 0) & torch.isfinite(scale), scale, torch.ones_like(scale))
        u = masked / scale[:, None, None]
    alpha = options.alpha
    if length_tokens < d:
        return _condition_wide(x, mask, masked, u, scale, options)
    gram = u.transpose(-1, -2) @ u
    finite = torch.isfinite(gram.diagonal(dim1=-2, dim2=-1)).all(-1)  # NaN/Inf always reach the diagonal
    zero = torch.zeros((), dtype=torch.float64, device=x.device)
    gram = torch.where(finite[:, None, None], gram, zero)
    eye = torch.eye(d, dtype=torch.float64, device=x.device)
    if options.mode == 'graying':
        # U (S / s_1)^eps V^T = u V diag(g / s) V^T; float32/16 tokens are not scaled, so u's units are X's
        grayed = _grayed_function(gram, options.epsilon, graying_floor(x.dtype))
        if scale is not None:
            grayed = grayed / scale[:, None, None]
        # (1 - alpha) X + alpha U (S / s_1)^eps V^T; not 1 + alpha (g / s - 1), which would cancel at s >> 1
        conditioned = masked @ ((1 - alpha) * eye + alpha * grayed)
        return conditioned, _status(conditioned, finite, x.dtype)
    bands = _Bands(mask, d)
    zu = torch.where(finite[:, None, None], bands.sums(u), zero)  # Z^T u (S, bands, channels)
    # a static choice: the same program for any valid sizes
    accurate = torch.where(finite[:, None, None], u, zero) if length_tokens <= ACCURATE_ROWS * d else None
    m_matrix, band_rows = regularised_function(gram, zu, bands, mask.sum(-1), options, accurate)
    if scale is not None:
        band_rows = band_rows * scale[:, None, None]
    # the band term as the product's addend: one write of X + C (alpha = 0: 0 + X I, exactly X)
    conditioned = torch.baddbmm(bands.spread(band_rows), masked, eye + alpha * m_matrix)
    return conditioned, _status(conditioned, finite, x.dtype)


def regularised_function(gram: torch.Tensor, zu: torch.Tensor, bands: _Bands, valid_count: torch.Tensor, options,
                         accurate: Optional[torch.Tensor] = None):
    """M = h(G~) (S, d, d) and the band rows (S, d bands, d) from G = u^T u and Z^T u (zero where X is not finite),
    so that X + C = X (I + alpha M) + Z (band rows) in u's units (see the module), h the spectral function of the
    mode, target_kappa and solver of ``options`` and alpha its alpha. ``accurate``: u itself, for stacks short
    enough to take their singular values from u~ V (ACCURATE_ROWS).

    Where n >= d: h of the d x d G~, and the band rows alpha rho F^T (I + M). Where n < d the bands are single
    tokens, so Z^T u is u's valid rows in order (zero below row n) and u~'s rows are those of
    W = Z^T u + rho F_live^T; h is taken on the token side, of W W^T (its rows past n, zero, get rho^2 on the
    diagonal: an eigenvalue below s~_1^2 that W's zero rows annihilate), so that G~'s d - n structural zeros never
    reach a solver: M = 0 and the band rows alpha (rho F_live^T + h(W W^T) W), since u~ h(u~^T u~) = h(u~ u~^T) u~.
    Both sides are d x d, so one solver call serves the stack."""
    d = gram.shape[-1]
    eye = torch.eye(d, dtype=torch.float64, device=gram.device)
    dct = _channel_candidates(d, d, gram.device)  # F: column j is the j-th DCT-II vector
    rho = TAU * gram.diagonal(dim1=-2, dim2=-1).sum(-1).sqrt()
    tokens_side = (valid_count < d)[:, None, None]
    cross = zu.transpose(-1, -2) @ dct.T  # u^T E = u^T Z F^T
    # where n >= d every band exists, so rho^2 E^T E = rho^2 F F^T = rho^2 I
    channel_gram = gram + rho[:, None, None] * (cross + cross.transpose(-1, -2)) + (rho**2)[:, None, None] * eye
    live_dct = dct.T * bands.live.unsqueeze(-1)  # F_live^T: row j is the j-th DCT-II vector where band j exists
    token_rows = zu + rho[:, None, None] * live_dct  # W: u~'s rows, in order, where n < d
    token_gram = torch.baddbmm(torch.diag_embed((~bands.live) * (rho**2).unsqueeze(-1)), token_rows,
                               token_rows.transpose(-1, -2))

    def column_squares(v, lam):  # of W^T V (one d x d product), or of u~ V = u V + rho Z F^T V (or lambda)
        channel_side = lam.clamp_min(0) if accurate is None else \
            (accurate @ v + rho[:, None, None] * bands.spread(dct.T @ v)).square().sum(-2)
        return torch.where(tokens_side[:, 0], (token_rows.transpose(-1, -2) @ v).square().sum(-2), channel_side)
    h, lift = _spectral_function(torch.where(tokens_side, token_gram, channel_gram), rho, options, column_squares)
    zero = torch.zeros((), dtype=torch.float64, device=gram.device)
    # X + alpha (u~ (I + M) - u) = X (I + alpha M) + alpha rho Z F^T (I + M) where n >= d; one product for both sides
    left = torch.where(tokens_side, h, rho[:, None, None] * dct.T)
    right = torch.where(tokens_side, token_rows, h)
    product = left @ right
    if lift is not None:  # Newton-Schulz: h(W W^T) W = c polar(W), refined from W itself (see _spectral_function)
        product = torch.where(tokens_side, polar_refinement_step(product, lift), product)
    rows = torch.where(tokens_side, live_dct, dct.T) * rho[:, None, None] + product
    return torch.where(tokens_side, zero, h), rows * options.alpha


def _condition_wide(x, mask, masked, u, scale, options):
    """:func:`condition_masked` for stacks of fewer token rows L than channels d (ViTDet's windows and small
    images, Swin's 7 x 7 windows): the same X + C from the L x L side instead of the d x d one.

    Every matrix has n <= L < d valid tokens, so its bands are single tokens and E's row for the k-th valid token is
    the k-th DCT-II vector. With u~ = u + rho E and any spectral function h, u~ h(u~^T u~) = h(u~ u~^T) u~, so
    X + C = X + alpha (rho E + h(G') u~), G' = u~ u~^T (L x L): one L x L eigh (or Newton-Schulz) instead of a d x d
    one, and the same h, shift and s~_1 as the d x d side (their nonzero eigenvalues are the same). Tokens outside the
    mask are zero rows of u~; their diagonal entries of G' are set to rho^2 (an eigenvalue below s~_1^2), so that
    h stays bounded there, and they add nothing to the valid rows. Graying uses G' = u u^T, unregularised.
    """
    stack, length, d = u.shape
    zero = torch.zeros((), dtype=torch.float64, device=x.device)
    outside = (~mask).to(torch.float64)
    alpha = options.alpha
    if options.mode == 'graying':
        gram = u @ u.transpose(-1, -2)
        finite = torch.isfinite(gram.diagonal(dim1=-2, dim2=-1)).all(-1)
        grayed = _grayed_function(torch.where(finite[:, None, None], gram, zero), options.epsilon,
                                  graying_floor(x.dtype))  # (S/s_1)^eps = g(.) u
        conditioned = (1 - alpha) * masked + alpha * (grayed @ u)
        return conditioned, _status(conditioned, finite, x.dtype)
    bands = _Bands(mask, d)
    dct = _channel_candidates(d, d, x.device)
    tokens_dct = bands.spread(dct.T.expand(stack, d, d))  # E: each valid token's DCT-II vector (n < d: weight 1)
    norm2 = u.square().sum(dim=(1, 2))
    finite = torch.isfinite(norm2)
    rho = TAU * torch.where(finite, norm2, zero).sqrt()
    regularised = torch.where(finite[:, None, None], u, zero) + rho[:, None, None] * tokens_dct  # u~
    gram_reg = regularised @ regularised.transpose(-1, -2)
    gram_reg = gram_reg + torch.diag_embed(outside * (rho**2).unsqueeze(-1))
    # the column norms of u~^T W are u~'s singular values
    m_matrix, lift = _spectral_function(gram_reg, rho, options,
                                        lambda w, lam: (regularised.transpose(-1, -2) @ w).square().sum(-2))
    lifted = m_matrix @ regularised
    if lift is not None:  # Newton-Schulz: c polar(u~), refined from u~ itself (see _spectral_function)
        lifted = polar_refinement_step(lifted, lift)
    correction = rho[:, None, None] * tokens_dct + lifted  # C / alpha, in u's units
    if scale is not None:
        correction = correction * scale[:, None, None]
    conditioned = masked + alpha * correction  # alpha = 0: exactly X
    return conditioned, _status(conditioned, finite, x.dtype)


def _grayed_function(gram: torch.Tensor, epsilon: float, s1_floor: float) -> torch.Tensor:
    """V diag(g(s) / s) V^T for the Gram matrices ``gram`` = V diag(s^2) V^T, g Token Graying's map: applied to the
    matrix whose Gram matrix it is (on either side), it gives U (S / s_1)^eps V^T. ``s1_floor``: graying's least
    s_1 (:func:`.modes.graying_floor`), in the units of ``gram``'s matrix."""
    lam, v = torch.linalg.eigh(gram)
    s = lam.clamp_min(0).sqrt()
    gray = _grayed(s, s[..., -1:], epsilon, s1_floor) / s.clamp_min(1e-300)
    return (v * gray.unsqueeze(-2)) @ v.transpose(-1, -2)


def _spectral_function(gram, rho, options, column_squares):
    """(M, c): M = h(G~) (S, k, k) for the regularised Gram matrices ``gram``, full rank (no structural zeros: where
    n < d they are taken on the token side), each shifted by delta = SHIFT rho^2 (see the module), h that of the
    mode and target_kappa of ``options``, computed with its solver (:func:`resolve_solver`); c (S,) the
    lift s~_1 / (t - 1) for 'newton_schulz' (sigma_max only), None for eigh. Newton-Schulz inverts the Gram matrix
    as it was rounded, eigenvalues near eps lambda_max included (on the token side of a rank-deficient matrix,
    1e-15 lambda_max, kappa 2.0024 on one of 40 random rank-47 rows of 95 tokens at d = 96), so the caller refines
    the token side's h(u~ u~^T) u~ = c polar(u~) from u~ itself (:func:`.matrix_functions.polar_refinement_step`:
    2.000004 there); eigh takes the singular values from ``column_squares`` instead. ``column_squares(V, lambda)``: the squares of the singular values that eigh's eigenvectors V and
    eigenvalues lambda give, either lambda or the squared column norms of u~ V for G~ = u~^T u~ (of u~^T V on the
    token side), accurate to eps s_1 where s = sqrt(lambda) is only accurate to eps s_1^2 / s (on a square,
    rank-deficient window, kappa from sqrt(lambda) misses the bound in its third digit)."""
    delta = SHIFT * rho**2
    target_kappa = options.target_kappa
    if resolve_solver(options.solver, options.mode, gram.device) == 'newton_schulz':
        upper = largest_eigenvalue_bound(gram)
        c = upper.sqrt() / (target_kappa - 1)
        eye = torch.eye(gram.shape[-1], dtype=gram.dtype, device=gram.device)
        shifted = gram + delta[:, None, None] * eye
        return c[:, None, None] * inverse_sqrt_newton_schulz(shifted, upper + delta, _NEWTON_SCHULZ_STEPS), c
    lam, v = torch.linalg.eigh(gram)
    squares = column_squares(v, lam)
    s = (squares + delta.unsqueeze(-1)).sqrt()
    s1 = lam[..., -1:].clamp_min(0).sqrt()
    lift = s1 / (target_kappa - 1) if options.mode == 'sigma_max' else (s1 / target_kappa - s).clamp_min(0)
    h = torch.where(s > 0, lift / torch.where(s > 0, s, torch.ones_like(s)), torch.zeros_like(s))
    return (v * h.unsqueeze(-2)) @ v.transpose(-1, -2), None


def _status(conditioned: torch.Tensor, finite: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """FINE, BAD_INPUT (not ``finite``) or BAD_OUTPUT (a value of X + C beyond ``dtype``'s range) per matrix."""
    return status_of_largest(torch.linalg.vector_norm(conditioned, ord=math.inf, dim=(1, 2)), finite, dtype)


def status_of_largest(largest: torch.Tensor, finite: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """:func:`_status` from the largest magnitude of each matrix's X + C (S,)."""
    overflow = ~(largest <= torch.finfo(dtype).max)  # NaN included
    return torch.where(finite, torch.where(overflow, BAD_OUTPUT, FINE), BAD_INPUT).to(torch.int8)


def finish(x: torch.Tensor, conditioned: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``conditioned`` (B, ..., d) on the tokens of ``mask`` (B, ...), ``x`` elsewhere, in x's dtype."""
    return torch.where(mask.unsqueeze(-1), conditioned.to(x.dtype), x)
