"""Conditioned embedded tokens: the correction that bounds kappa of a token matrix.

Pure PyTorch, no OpenMMLab imports. Reference: H. Saratchandran and S. Lucey, "Enhancing Transformers
Through Conditioned Embedded Tokens", ICCV 2025 (arXiv 2505.12789).

For one image, X is the N x d matrix of embedded tokens, with thin SVD X = U S V^T, singular values
s_1 >= ... >= s_r >= 0 (r = min(N, d)) and condition number kappa(X) = s_1 / s_r. A correction C moves
every singular value up while keeping the singular vectors:

    X + C = U (S + D) V^T,   C = U D V^T,   D = alpha * diag(g(s_i))

``mode='sigma_max'`` (the paper's construction):  g(s_i) = s_1 / (t - 1)
    With t = target_kappa = 2 this is C = s_1 U V^T and the singular values land in [s_1, 2 s_1].
``mode='floor'``:  g(s_i) = max(s_1 / t - s_i, 0)
    Lifts only the singular values below s_1 / t to s_1 / t and leaves the rest of X untouched.

Both give kappa(X + C) <= t for alpha = 1; alpha scales C (alpha = 0 is the identity).

``mode='graying'`` (Token Graying, arXiv 2505.01996, "Always Skip Attention"):  X + C = U (S / s_1)^eps V^T
    The paper's map, faithfully: every singular value becomes (s_i / s_1)^eps with 0 < eps <= 1 (``epsilon``),
    so kappa -> kappa^eps and the result is rescaled to s_1 = 1 (it does not scale with X). target_kappa plays
    no part; alpha still scales C = U ((S / s_1)^eps - S) V^T. Where the paper is silent we decided: singular
    values at round-off level (s_i <= RANK_RTOL * s_1, the null directions below) map to 0, not to
    (s_i / s_1)^eps. The map has infinite slope at 0, so it would amplify round-off (e.g. 1e-8 -> 4e-3 at
    eps = 0.3) into directions X does not have; a rank-deficient X therefore stays rank-deficient (graying
    lifts nothing from zero and needs no null-space completion), and the zero matrix stays zero.

Rank-deficient X is the common case (a LayerNorm'd patch embedding has X 1 = 0), and then the guarantee
needs U and V *completed* over the null directions: a zero singular value must be lifted along some unit
vector of the orthogonal complement of range(X), which X V S^-1 cannot provide. The thin SVD gives that
completion; the Gram path below constructs it explicitly.

Gram path (default, N >> d at detection resolutions): with G = X^T X = V S^2 V^T (one d x d eigh in float64,
since forming G squares kappa), the non-null directions need no explicit U:

    X + C = X V (I + D S^-1) V^T   on the directions with s_i > tol * s_1,
    plus  U_0 D_0 V_0^T             on the null directions V_0 (s_i <= tol * s_1),

where U_0 is an orthonormal basis of k vectors orthogonal to range(X), obtained by projecting fixed band
vectors Z out of range(X): candidate j is the normalized indicator of the j-th of m = k + 4 horizontal bands
of whole token rows of the image (runs of consecutive tokens for (N, d) input, or a grid with fewer rows than
bands), so that the lift of a null direction is spread evenly over the tokens. U_0 and V_0 are canonical:
eigh returns an arbitrary basis of the null space and of the completion's span (signs for k = 1, a rotation
for k >= 2; LAPACK and cuSOLVER choose differently), so each is rotated to the orthonormal basis of its
subspace closest to fixed candidates (the polar factor of the k x k overlap), V_0 to the first k DCT-II
vectors of R^d (the first is the ones vector, LayerNorm's null direction), U_0 to the first k band vectors,
and u_j is paired with v_j. X + C then depends on X only, not on the eigensolver. With A = G^+ X^T Z and W
the completion's lift (m x d),

    X + C = X (I + M - A W) + Z W,

where M = V D S^-1 V^T (d x d) and X^T Z is a sum over each band's tokens. The cost is the two products
(the Gram matrix and X times one d x d matrix, about 2 N d^2 multiply-adds per image) and little else: the
path streams over X twice in chunks of rows (:func:`_conditioned_grid_streaming`) and never holds an N x d
float64 copy. Null directions are common: Swin-T's patch embedding maps 4 x 4 x 3 = 48 pixel values to 96
channels, so its X has rank <= 49 and 47 directions to complete.
When N < d the same is done on X^T (the N x N Gram matrix). ``method='svd'`` computes the same correction
from ``torch.linalg.svd`` and serves as the reference.

Centred variant (``centred=True``): a LayerNorm (the next block's norm1) subtracts each token's channel mean,
i.e. projects X onto the complement of the all-ones channel vector 1, so any part of C along 1 never reaches
the attention. The centred variant conditions Y = X Q, the coordinates of X in an orthonormal basis Q of that
complement (d - 1 columns), and adds C = C_Y Q^T: kappa(Y + C_Y) <= t, and C 1 = 0. Q is taken from one
Householder reflection H (H 1/sqrt(d) = e_1, Q = H[:, 1:]), so X Q and C_Y Q^T cost O(N d) each. Where the
ones vector is X's only null direction (a LayerNorm'd patch embedding with at least as many pixel values
per patch as channels), Y has full rank and nothing needs completing.

Token-scale controls (:func:`match_token_scale`): the correction also makes the tokens bigger, by
r = ||X + C||_F / ||X||_F per image (4-5 for ``sigma_max`` on LayerNorm'd patch embeddings), which by itself
shrinks every block's residual update relative to the stream. Two parameter-free controls separate the two
effects: ``'scale_matched'`` returns r X (the conditioned model's token scale, kappa unchanged; the next
LayerNorm is scale invariant, so the first attention sees what the baseline's sees) and ``'norm_matched'``
returns (X + C) / r (kappa(X + C) <= t at the baseline's token scale; the first attention sees what the
conditioned model's sees). r is a constant in backward.

Per-window conditioning (:func:`condition_token_windows`) applies the same construction to the token matrix
of each attention window of a windowed-attention backbone (Swin, ViTDet) instead of the whole image.
"""
import itertools
import math
from typing import List, Optional, Sequence, Tuple

import torch

__all__ = ['condition_tokens', 'condition_token_windows', 'condition_valid_regions', 'condition_number',
           'token_correction', 'write_conditioned', 'token_windows', 'channel_mean_complement',
           'match_token_scale', 'BOUNDING_MODES', 'CONDITIONING_MODES', 'CONDITIONING_METHODS', 'GRAYING_EPSILON',
           'TOKEN_SCALE_CONTROLS']

# Modes that bound kappa(X + C) <= target_kappa; 'graying' raises small singular values without a bound.
BOUNDING_MODES = ('sigma_max', 'floor')
CONDITIONING_MODES = BOUNDING_MODES + ('graying', )
CONDITIONING_METHODS = ('gram', 'svd')
TOKEN_SCALE_CONTROLS = ('scale_matched', 'norm_matched')

# Singular values below RANK_RTOL * s_1 are treated as null directions on the Gram path. The eigenvalues
# of a float64 Gram matrix carry an absolute error of about eps * N * s_1^2, so singular values below
# ~1e-6 s_1 cannot be resolved from it; those directions are completed exactly instead. Leaving a true
# singular value s <= RANK_RTOL * s_1 in place moves the corrected spectrum by at most s (Weyl), so
# kappa(X + C) stays within (1 + RANK_RTOL) of the bound.
RANK_RTOL = 1e-5
# Extra candidate vectors for the null-space completion, so that a few candidates that happen to lie
# (almost) in range(X) still leave k good ones.
_COMPLETION_OVERSAMPLING = 4
# A Gram matrix whose largest diagonal entry is below this is recomputed from rescaled tokens: its
# entries may have underflowed (float64 tokens below ~1e-100), or the sample is zero.
_GRAM_FLOOR = 1e-200
# Token Graying's default strength (the authors' default).
GRAYING_EPSILON = 0.95


def _check_arguments(mode: str, alpha: float, target_kappa: float, method: str, epsilon: float) -> None:
    if mode not in CONDITIONING_MODES:
        raise ValueError(f'conditioning mode must be one of {CONDITIONING_MODES}, got {mode!r}')
    if method not in CONDITIONING_METHODS:
        raise ValueError(f'conditioning method must be one of {CONDITIONING_METHODS}, got {method!r}')
    if not (isinstance(alpha, (int, float)) and math.isfinite(alpha) and alpha >= 0):
        raise ValueError(f'conditioning alpha must be a finite number >= 0, got {alpha!r}')
    if not (isinstance(target_kappa, (int, float)) and math.isfinite(target_kappa)
            and target_kappa > 1):
        raise ValueError(f'target_kappa must be a finite number > 1, got {target_kappa!r}')
    if isinstance(epsilon, bool) or not (isinstance(epsilon, (int, float)) and 0 < epsilon <= 1):
        raise ValueError(f"graying epsilon must be a number in (0, 1] (kappa -> kappa^epsilon; the authors' "
                         f'default is {GRAYING_EPSILON}), got {epsilon!r}')


def _check_finite(x: torch.Tensor, where: str) -> None:
    if not bool(torch.isfinite(x).all()):
        bad = int((~torch.isfinite(x)).sum())
        raise ValueError(
            f'{where}: the token matrix has {bad} non-finite (NaN/Inf) values out of {x.numel()} before '
            'conditioning; they come from the layers before it (patch embedding, input or a diverged '
            'training step), not from the conditioning. Lower the learning rate or check the input.')


def _lift(s: torch.Tensor, s1: torch.Tensor, mode: str, alpha: float, target_kappa: float,
          epsilon: float = GRAYING_EPSILON) -> torch.Tensor:
    """D = alpha * g(s): how much each singular value is raised (same shape as ``s``)."""
    if mode == 'sigma_max':
        return (alpha / (target_kappa - 1)) * s1.expand_as(s)
    if mode == 'floor':
        return alpha * (s1 / target_kappa - s).clamp_min(0)
    return alpha * (_grayed(s, s1, epsilon) - s)


def _grayed(s: torch.Tensor, s1: torch.Tensor, epsilon: float) -> torch.Tensor:
    """Token Graying's singular values (s_i / s_1)^eps, with round-off-level s_i (<= RANK_RTOL s_1) -> 0.

    The masked branches see only safe values, so that the gradient (detach=False) stays finite at s_i = 0
    and s_1 = 0.
    """
    live = s > RANK_RTOL * s1
    ratio = torch.where(live, s / torch.where(live, s1, torch.ones_like(s1)), torch.ones_like(s))
    return torch.where(live, ratio**epsilon, torch.zeros_like(s))


def _gram_scales(lam: torch.Tensor, mode: str, alpha: float, target_kappa: float, epsilon: float
                 ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """From the ascending eigenvalues ``lam`` of G = X^T X: (s, null, lift, scale, keep).

    ``null`` marks the null directions to complete (each lifted by ``lift``), ``scale`` the factor C adds
    to X v_i on the others and ``keep`` = 1 + scale, the factor of X + C (X + C = X V diag(keep) V^T there).
    Zero samples (s_1 = 0) get nothing.
    """
    s = lam.clamp_min(0).sqrt()
    s1 = s[..., -1:]
    has_signal = s1 > 0
    null = (s <= RANK_RTOL * s1) & has_signal  # a prefix of the ascending order, per sample
    lift = _lift(s, s1, mode, alpha, target_kappa, epsilon) * has_signal
    # Non-null directions: X v_i scaled by (s_i + D_i) / s_i, i.e. X v_i (D_i / s_i) added.
    scale = torch.where(null | ~has_signal, torch.zeros_like(s), lift / s.clamp_min(1e-300))
    keep = scale + 1
    if mode == 'graying':
        # keep = (1 - alpha) + alpha g_i / s_i, formed directly: 1 + (g_i / s_i - 1) would cancel to 0 where
        # s_i >> 1 (graying's output does not scale with X). Null directions have g_i = 0: X's own (round-off)
        # component there is scaled by 1 - alpha, as on the SVD path, and nothing is lifted or completed.
        keep = (1 - alpha) + alpha * _grayed(s, s1, epsilon) / s.clamp_min(1e-300)
        scale = keep - 1
        null = torch.zeros_like(null)
    return s, null, lift, scale, keep


def _householder_to_ones(d: int, dtype: torch.dtype, device: torch.device) -> Tuple[torch.Tensor, float]:
    """(w, c) of the reflection H = I - c w w^T that maps 1/sqrt(d) to e_1 (H is symmetric, H H = I)."""
    w = torch.full((d, ), 1 / math.sqrt(d), dtype=dtype, device=device)
    w[0] -= 1
    return w, 2 / float(w @ w)


def channel_mean_complement(x: torch.Tensor) -> torch.Tensor:
    """X Q for tokens X (..., N, d): each token in an orthonormal basis Q of the complement of the all-ones
    channel vector (shape (..., N, d - 1)). Singular values of X Q are those of X with the channel mean of
    every token removed, i.e. what a following LayerNorm can see. Needs d >= 2."""
    w, c = _householder_to_ones(x.shape[-1], x.dtype, x.device)
    return (x - c * (x @ w).unsqueeze(-1) * w)[..., 1:]


def _from_channel_mean_complement(y: torch.Tensor) -> torch.Tensor:
    """Y Q^T for Y (..., N, d - 1): back to channel coordinates, with no component along the ones vector."""
    z = torch.nn.functional.pad(y, (1, 0))
    w, c = _householder_to_ones(z.shape[-1], z.dtype, z.device)
    return z - c * (z @ w).unsqueeze(-1) * w


def _bands(n: int, m: int, width: int = 1) -> List[Tuple[int, int]]:
    """[start, end) token ranges of ``m`` bands of an (n / width, width) token grid, row-major.

    The bands are runs of whole grid rows, split as evenly as possible, where the grid has at least ``m``
    rows, and runs of consecutive tokens otherwise (always for width 1).
    """
    n, m, width = int(n), int(m), int(width)  # sizes are tensors while torch.jit.trace records them
    height = n // width
    if m > height:
        width, height = 1, n
    edges = [round(j * height / m) * width for j in range(m + 1)]
    return list(zip(edges[:-1], edges[1:]))


def _band_sums(x: torch.Tensor, bands: List[Tuple[int, int]]) -> torch.Tensor:
    """X^T Z for the normalized band indicators Z: (B, d, m), one pass over x (B, N, d)."""
    return torch.stack([x[:, start:end].sum(1) / math.sqrt(end - start) for start, end in bands], dim=-1)


def _add_bands(out: torch.Tensor, weights: torch.Tensor, bands: List[Tuple[int, int]]) -> None:
    """out += Z W in place for the normalized band indicators Z and W (B, m, d): one pass over out."""
    for j, (start, end) in enumerate(bands):
        out[:, start:end] += (weights[:, j] / math.sqrt(end - start)).unsqueeze(1)


def _channel_candidates(d: int, k: int, device: torch.device) -> torch.Tensor:
    """F (d x k): the first k columns of the orthonormal DCT-II basis of R^d, float64. Column 0 is the
    constant vector, the null direction of LayerNorm'd tokens; the others are well spread over the channels.
    """
    i = torch.arange(d, dtype=torch.float64, device=device).unsqueeze(-1)
    j = torch.arange(k, dtype=torch.float64, device=device)
    f = torch.cos(math.pi * (i + 0.5) * j / d) * math.sqrt(2 / d)
    f[:, 0] = 1 / math.sqrt(d)
    return f


# A k x k overlap matrix (entries are inner products of unit vectors) whose smallest singular value is below
# this does not define a canonical basis: its polar factor would amplify round-off by 1 / sigma_min.
_CANONICAL_RTOL = 1e-6


def _canonical_rotation(overlap: torch.Tensor, needed: torch.Tensor) -> Optional[torch.Tensor]:
    """The polar factor of blockdiag(overlap on the needed x needed block, I) (B, k, k), or None when that
    block is (near-)singular.

    For a basis B of a subspace and fixed candidates F, ``overlap`` = B^T F; B times the result is the
    orthonormal basis of the subspace closest to F, the same for B and B S (S orthogonal: the polar factor
    of S^T M is S^T times that of M). So it does not depend on which basis an eigensolver returned. Only
    the needed columns (a sample may need fewer than k) are rotated, among themselves.
    """
    both = needed.unsqueeze(-1) & needed.unsqueeze(-2)
    eye = torch.eye(overlap.shape[-1], dtype=overlap.dtype, device=overlap.device)
    p, sigma, qh = torch.linalg.svd(torch.where(both, overlap, eye))  # P Q^T: free of the SVD's own signs
    if bool((sigma[..., -1] < _CANONICAL_RTOL).any()):
        return None
    return p @ qh


def _canonical_null_directions(v: torch.Tensor, null_count: torch.Tensor, k: int) -> Optional[torch.Tensor]:
    """V_0 (B, d, k) made canonical: the first null_count[b] columns of ``v`` (eigenvectors of G, null ones
    first) rotated to the orthonormal basis of the null space closest to the DCT candidates
    (:func:`_channel_candidates`). eigh returns an arbitrary basis of the null space (signs for k = 1, a
    rotation for k >= 2), which differs between LAPACK and cuSOLVER. None where it is ill-defined.
    """
    v_0 = v[..., :k]
    needed = torch.arange(k, device=v.device) < null_count.unsqueeze(-1)
    rotation = _canonical_rotation(v_0.transpose(-1, -2) @ _channel_candidates(v.shape[-2], k, v.device), needed)
    return None if rotation is None else v_0 @ rotation


def _completion_lift(x_z: torch.Tensor, v: torch.Tensor, inv_s2: torch.Tensor, lift_null: torch.Tensor,
                     null_count: torch.Tensor) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
    """(A, W) such that U = Z - X A is orthogonal to range(X) and the null directions' lift is U W.

    From d x m and m x m quantities only: ``x_z`` is X^T Z (Z orthonormal, m columns), ``v``/``inv_s2`` the
    eigenvectors of G = X^T X and 1/s_i^2 on its non-null directions (0 on the null ones, which come
    first), ``lift_null`` (B, k) the lift D_j of null direction j, ``null_count`` (B,) how many sample b
    has. A = G^+ X^T Z; U^T U = I - (X^T Z)^T A, whose top-k eigenvectors Q give the orthonormal completion
    U Q Lambda^-1/2. Both sides are made canonical before pairing column j with column j: the completion is
    rotated by R_u, the polar factor of its overlap with the first k candidates, (U Q Lambda^-1/2)^T Z E =
    Lambda^-1/2 Q^T (U^T U) E (U^T Z = U^T U), and V_0 by R_v (:func:`_canonical_null_directions`), so that
    W = Q Lambda^-1/2 R_u diag(D) (V_0 R_v)^T does not depend on the eigensolver's choice of bases. Returns
    None when the candidates leave fewer than the needed independent directions outside range(X), or
    where a canonical basis is ill-defined.
    """
    k = lift_null.shape[-1]
    a = (v * inv_s2.unsqueeze(-2)) @ (v.transpose(-1, -2) @ x_z)
    u_u = -(x_z.transpose(-1, -2) @ a)
    u_u = 0.5 * (u_u + u_u.transpose(-1, -2))
    u_u.diagonal(dim1=-2, dim2=-1).add_(1)
    lam_u, w = torch.linalg.eigh(u_u)
    lam_u, w = lam_u.flip(-1)[..., :k], w.flip(-1)[..., :k]
    needed = torch.arange(k, device=x_z.device) < null_count.unsqueeze(-1)
    if bool(((lam_u < 1e-6) & needed).any()):
        return None
    q = w * torch.where(needed, lam_u, torch.ones_like(lam_u)).rsqrt().unsqueeze(-2)
    rotation = _canonical_rotation(q.transpose(-1, -2) @ u_u[..., :k], needed)
    v_c = _canonical_null_directions(v, null_count, k)
    if rotation is None or v_c is None:
        return None
    return a, (q @ rotation) @ ((lift_null * needed).unsqueeze(-1) * v_c.transpose(-1, -2))


def _complete_null_space(x: torch.Tensor, bands: List[Tuple[int, int]], v: torch.Tensor, inv_s2: torch.Tensor,
                         null_count: torch.Tensor, k: int) -> Optional[torch.Tensor]:
    """Orthonormal (B, N, k) vectors orthogonal to range(x), projected out of the band vectors explicitly and
    twice (one Gram-Schmidt pass loses orthogonality in floating point: "twice is enough"), for spectra where
    :func:`_completion_lift`'s single projection is not accurate. Sample b needs the first null_count[b].
    The basis of the top-k subspace is made canonical as in :func:`_completion_lift`: rotated by the polar
    factor of its overlap with the first k (unprojected) band vectors, basis^T Z E, which depends only on
    the subspace and the fixed candidates (the projected candidates would give the same up to the
    projection's round-off). Returns None when the candidates do not leave enough independent directions
    or the canonical basis is ill-defined.
    """
    batch, n, _ = x.shape
    z = x.new_zeros(batch, n, len(bands))
    for j, (start, end) in enumerate(bands):
        z[:, start:end, j] = 1 / math.sqrt(end - start)
    weighted = v * inv_s2.unsqueeze(-2)
    for _ in range(2):
        z = z - x @ (weighted @ (v.transpose(-1, -2) @ (x.transpose(-1, -2) @ z)))
    lam, w = torch.linalg.eigh(z.transpose(-1, -2) @ z)
    lam, w = lam.flip(-1)[..., :k], w.flip(-1)[..., :k]
    needed = torch.arange(k, device=x.device) < null_count.unsqueeze(-1)
    if bool(((lam < 1e-6) & needed).any()):
        return None
    basis = z @ (w * torch.where(needed, lam, torch.ones_like(lam)).rsqrt().unsqueeze(-2))
    rotation = _canonical_rotation(_band_sums(basis, bands[:k]), needed)  # basis^T Z E
    return None if rotation is None else basis @ rotation


def _correction_gram_tall(x: torch.Tensor, gram: torch.Tensor, mode: str, alpha: float, target_kappa: float,
                          add_tokens: bool = False, grid_width: int = 1,
                          epsilon: float = GRAYING_EPSILON) -> Optional[torch.Tensor]:
    """C (X + C with ``add_tokens``) for float64 x (B, N, d), N >= d, from its d x d Gram matrix ``gram``.

    The product X (M - A W) (X (I + M - A W) for X + C) and, with null directions, two passes (band sums,
    band lifts). Null directions beside a non-null spectrum wider than kappa 1e3, where the single
    projection behind A would leave up to eps * kappa^2 of range(X) in the completion, are completed by
    :func:`_complete_null_space` instead. Returns None when the band candidates cannot complete the null
    space (the SVD then does the work).
    """
    lam, v = torch.linalg.eigh(gram)  # ascending
    s, null, lift, scale, keep = _gram_scales(lam, mode, alpha, target_kappa, epsilon)
    has_signal = s[..., -1:] > 0
    # Summed over the non-null directions, X v_i (D_i / s_i) is X M with the d x d matrix M = V diag(D/S) V^T
    # (X (I + M) for X + C, at no extra cost).
    product = (v * (keep if add_tokens else scale).unsqueeze(-2)) @ v.transpose(-1, -2)
    null_count = null.sum(-1)
    k = int(null_count.max())
    if k == 0:
        return x @ product
    inv_s2 = torch.where(null | ~has_signal, torch.zeros_like(s), 1 / lam.clamp_min(1e-300))
    bands = _bands(x.shape[-2], min(x.shape[-2], k + _COMPLETION_OVERSAMPLING), grid_width)
    lift_null = (lift * null)[..., :k]
    if bool((lam[..., -1] * inv_s2.amax(-1) > 1e6).any()):
        completion = _complete_null_space(x, bands, v, inv_s2, null_count, k)
        v_c = _canonical_null_directions(v, null_count, k)
        if completion is None or v_c is None:
            return None
        # Null direction j (j < k_b) of sample b: canonical completion vector j times D_j times canonical v_j^T.
        return torch.baddbmm(x @ product, completion, lift_null.unsqueeze(-1) * v_c.transpose(-1, -2))
    completion = _completion_lift(_band_sums(x, bands), v, inv_s2, lift_null, null_count)
    if completion is None:
        return None
    a, lift_w = completion
    result = x @ (product - a @ lift_w)
    _add_bands(result, lift_w, bands)
    return result


# Rows of the token grid processed at a time by the streaming Gram path: about 8k tokens, so that the float64
# copy of a chunk (6 MB at d = 96) is reused from cache instead of allocating the N x d float64 matrix.
_CHUNK_TOKENS = 8192


def _conditioned_grid_streaming(grid: torch.Tensor, out: torch.Tensor, mode: str, alpha: float,
                                target_kappa: float, epsilon: float = GRAYING_EPSILON) -> bool:
    """Write X + C into ``out`` for the token grids ``grid`` (B, H, W, d), H * W >= d, reading X twice.

    The Gram path with nothing else materialized: pass 1 casts chunks of rows to float64 and accumulates
    G = X^T X; with null directions, a reduction sums each band's tokens (the band candidates are runs of
    whole grid rows, :func:`_bands`); pass 2 casts the chunks again and writes X (I + M - A W) plus the band
    lifts Z W, cast to ``out``'s dtype, into ``out`` (B, H, W, d; any strides, e.g. the valid part of a
    padded batch). Returns False, having written nothing, where the explicit path must do the work:
    non-finite or extreme tokens, fewer grid rows than bands, or a completion this shortcut cannot make
    accurately.
    """
    batch, height, width, d = (int(size) for size in grid.shape)  # tensors while torch.jit.trace records
    rows = max(1, _CHUNK_TOKENS // width)
    chunks = [(r, min(height, r + rows)) for r in range(0, height, rows)]
    buffer = torch.empty(batch, min(rows, height), width, d, dtype=torch.float64, device=grid.device)
    gram = torch.zeros(batch, d, d, dtype=torch.float64, device=grid.device)
    for start, end in chunks:
        chunk = buffer[:, :end - start]
        chunk.copy_(grid[:, start:end])
        tokens = chunk.view(batch, -1, d)
        gram += tokens.transpose(-1, -2) @ tokens
    largest = gram.diagonal(dim1=-2, dim2=-1).amax(-1)
    if not bool(torch.isfinite(gram).all() & (largest >= _GRAM_FLOOR).all()):
        return False
    lam, v = torch.linalg.eigh(gram)  # ascending
    s, null, lift, scale, keep = _gram_scales(lam, mode, alpha, target_kappa, epsilon)  # s_1 > 0: G >= floor
    product = (v * keep.unsqueeze(-2)) @ v.transpose(-1, -2)  # I + M
    null_count = null.sum(-1)
    k = int(null_count.max())
    bands = []
    if k:
        inv_s2 = torch.where(null, torch.zeros_like(s), 1 / lam.clamp_min(1e-300))
        m = k + _COMPLETION_OVERSAMPLING
        if m > height or bool((lam[..., -1] * inv_s2.amax(-1) > 1e6).any()):
            return False
        bands = [(start // width, end // width) for start, end in _bands(height * width, m, width)]  # grid rows
        norms = [math.sqrt((end - start) * width) for start, end in bands]
        x_z = torch.stack([grid[:, start:end].sum(dim=(1, 2), dtype=torch.float64) / norm
                           for (start, end), norm in zip(bands, norms)], dim=-1)
        completion = _completion_lift(x_z, v, inv_s2, (lift * null)[..., :k], null_count)
        if completion is None:
            return False
        a, lift_w = completion
        product = product - a @ lift_w
        # Z W: every token of band j gets W_j / sqrt(tokens in band j).
        bands = [(start, end, (lift_w[:, j] / norm)[:, None, None]) for j, ((start, end), norm)
                 in enumerate(zip(bands, norms))]
    for start, end in chunks:
        chunk = buffer[:, :end - start]
        chunk.copy_(grid[:, start:end])
        conditioned = (chunk.view(batch, -1, d) @ product).view(chunk.shape)
        if not bands:
            out[:, start:end].copy_(conditioned)
        for band_start, band_end, band_lift in bands:  # the bands this chunk of rows meets
            low, high = max(start, band_start), min(end, band_end)
            if low < high:
                torch.add(conditioned[:, low - start:high - start], band_lift, out=out[:, low:high])
    return True


def _correction_svd(x: torch.Tensor, mode: str, alpha: float, target_kappa: float,
                    epsilon: float = GRAYING_EPSILON) -> torch.Tensor:
    """Reference C from the thin SVD (LAPACK completes U and V over null directions).

    That completion pairs whatever null-space bases the SVD returns, so over null directions this path is
    not canonical (it can differ between devices and libraries); the Gram path's completion is.
    """
    u, s, vh = torch.linalg.svd(x, full_matrices=False)
    s1 = s[..., :1]
    return (u * _lift(s, s1, mode, alpha, target_kappa, epsilon).unsqueeze(-2)) @ vh


def token_correction(x: torch.Tensor, mode: str = 'sigma_max', alpha: float = 1.0,
                     target_kappa: float = 2.0, method: str = 'gram',
                     where: str = 'token_correction', centred: bool = False,
                     add_tokens: bool = False, grid_width: int = 1,
                     epsilon: float = GRAYING_EPSILON) -> torch.Tensor:
    """The correction C for float64 token matrices ``x`` of shape (B, N, d); no argument checks.

    With ``add_tokens`` it returns X + C instead, computed without a separate pass to add X. ``grid_width``
    is the width of the token grid the N rows come from (row-major), which places the null-space completion
    on bands of whole grid rows.
    Raises ValueError (naming ``where``) on NaN/Inf in ``x``.
    """
    if centred:
        if x.shape[-1] < 2:  # no complement to condition: a single channel is all channel mean
            _check_finite(x, where)
            return x.clone() if add_tokens else torch.zeros_like(x)
        correction = _from_channel_mean_complement(
            token_correction(channel_mean_complement(x), mode, alpha, target_kappa, method, where,
                             epsilon=epsilon))
        return x + correction if add_tokens else correction
    if alpha == 0:
        _check_finite(x, where)
        return x.clone() if add_tokens else torch.zeros_like(x)
    wide = x.shape[-2] < x.shape[-1]
    tall = x.transpose(-1, -2) if wide else x  # kappa and the construction are the same for X^T
    correction = None
    if method == 'gram':
        gram = tall.transpose(-1, -2) @ tall
        # Squares of float32/16 values neither overflow nor underflow in float64, so the Gram matrix of
        # the tokens themselves is usable; NaN/Inf in x always reach its diagonal. Only float64 tokens of
        # extreme magnitude (or all-zero ones) take the rescaled path below.
        largest = gram.diagonal(dim1=-2, dim2=-1).amax(-1)
        if bool(torch.isfinite(gram).all() & (largest >= _GRAM_FLOOR).all()):
            correction = _correction_gram_tall(tall, gram, mode, alpha, target_kappa, add_tokens,
                                               1 if wide else grid_width, epsilon)
            if correction is not None:
                return correction.transpose(-1, -2) if wide else correction
    _check_finite(x, where)
    # Scale each sample to max |x| = 1 so that the Gram matrix neither overflows nor underflows;
    # C is homogeneous of degree 1 in X, so it is scaled back afterwards (graying's is not: see below).
    amax = tall.abs().amax(dim=(-2, -1), keepdim=True)
    unit = tall / torch.where(amax > 0, amax, torch.ones_like(amax))
    if method == 'gram':
        correction = _correction_gram_tall(unit, unit.transpose(-1, -2) @ unit, mode, alpha, target_kappa,
                                           grid_width=1 if wide else grid_width, epsilon=epsilon)
    if correction is None:  # method='svd', or the Gram path's completion had no room to work
        correction = _correction_svd(unit, mode, alpha, target_kappa, epsilon)
    if mode == 'graying':
        # X + C = (1 - alpha) X + alpha U (S / s_1)^eps V^T, whose second term is the same for X and for X / amax;
        # formed without X + (C - X), which would cancel the O(1) result away at large amax.
        conditioned = correction + unit + (1 - alpha) * (tall - unit)
        correction = conditioned if add_tokens else conditioned - tall
    else:
        correction = correction * amax
        if add_tokens:
            correction = correction + tall
    return correction.transpose(-1, -2) if wide else correction


def condition_tokens(x: torch.Tensor, mode: str = 'sigma_max', alpha: float = 1.0,
                     target_kappa: float = 2.0, detach: bool = True, method: str = 'gram',
                     where: str = 'condition_tokens', centred: bool = False,
                     epsilon: float = GRAYING_EPSILON) -> torch.Tensor:
    """Return X + C for a batch of token matrices, so that kappa(X + C) <= target_kappa per sample
    (kappa(X + C) = kappa(X)^epsilon with ``mode='graying'``).

    Args:
        x (Tensor): token matrices of shape (B, N, d) or (N, d), or token grids (B, H, W, d) (each the
            H*W x d matrix of its tokens, row-major; the grid only places the null-space completion on bands
            of whole rows); any floating dtype. The correction is computed in float64 and the result is
            returned in ``x.dtype``.
        mode (str): 'sigma_max' (C = s_1/(t-1) U V^T, the paper's construction), 'floor' (lift only
            the singular values below s_1/t to s_1/t) or 'graying' (X + C = U (S/s_1)^epsilon V^T, Token
            Graying; see the module docstring). Default: 'sigma_max'.
        alpha (float): scale of the correction; 1 reaches the bound, 0 disables it. Default: 1.0.
        target_kappa (float): the bound t > 1 ('sigma_max', 'floor'). Default: 2.0 (the paper's value).
        detach (bool): treat C as a constant in backward, so the gradient w.r.t. ``x`` is the identity.
            With False the gradient flows through the SVD; directions that are (nearly) null or have
            (nearly) equal singular values contribute no gradient instead of an infinite one.
            Default: True.
        method (str): 'gram' (d x d or N x N Gram matrix, cheap when N >> d) or 'svd' (full thin SVD,
            the reference). Default: 'gram'.
        where (str): a name for error messages, e.g. the module that calls this.
        centred (bool): condition X on the complement of the all-ones channel vector only (see the module
            docstring): kappa(X Q + C Q) <= target_kappa and C 1 = 0, so nothing is lifted along the
            direction the next LayerNorm removes. Default: False (the paper's construction).
        epsilon (float): Token Graying's exponent, 0 < epsilon <= 1 ('graying' only; 1 keeps the singular
            values' ratios, smaller is stronger). Default: 0.95 (the authors' default).

    Returns:
        Tensor: X + C with the shape and dtype of ``x``. A zero matrix is returned unchanged.

    Raises:
        ValueError: on NaN/Inf in ``x`` or on invalid arguments.
    """
    _check_arguments(mode, alpha, target_kappa, method, epsilon)
    if x.dim() not in (2, 3, 4):
        raise ValueError(f'{where}: expected tokens of shape (B, N, d), (N, d) or (B, H, W, d), got '
                         f'{tuple(x.shape)}')
    if not x.is_floating_point():
        raise ValueError(f'{where}: expected floating-point tokens, got {x.dtype}')
    grid = {2: lambda t: t[None, :, None], 3: lambda t: t[:, :, None], 4: lambda t: t}[x.dim()](x)
    if grid.numel() == 0:
        return x
    options = dict(mode=mode, alpha=alpha, target_kappa=target_kappa, method=method, where=where, centred=centred,
                   epsilon=epsilon)
    if detach or not torch.is_grad_enabled() or not x.requires_grad:
        out = torch.empty(grid.shape, dtype=x.dtype, device=x.device)
        with torch.no_grad():
            write_conditioned(grid.detach(), out, **options)
        if torch.is_grad_enabled() and x.requires_grad:
            out = _ConstantCorrection.apply(grid, out)
    else:
        batch, height, width, d = grid.shape
        _check_finite(grid, where)
        flat = grid.reshape(batch, height * width, d)
        out = (flat + _DifferentiableCorrection.apply(flat, mode, alpha, target_kappa, method, centred,
                                                      width, epsilon)).view(grid.shape)
    return out.view(x.shape)


def write_conditioned(grid: torch.Tensor, out: torch.Tensor, mode: str = 'sigma_max', alpha: float = 1.0,
                      target_kappa: float = 2.0, method: str = 'gram', where: str = 'write_conditioned',
                      centred: bool = False, epsilon: float = GRAYING_EPSILON) -> None:
    """Write X + C for the token grids ``grid`` (B, H, W, d) into ``out`` (same shape, any dtype and strides).

    The work of :func:`condition_tokens` (same arguments; C a constant, no autograd) without allocating the
    result, so that a caller can condition part of a tensor in place, e.g. the valid region of an image in
    a padded batch. Cheap Gram cases stream over X twice (:func:`_conditioned_grid_streaming`); the others
    take the explicit path on a float64 copy.
    """
    batch, height, width, d = grid.shape
    if method == 'gram' and not centred and alpha != 0 and height * width >= d \
            and _conditioned_grid_streaming(grid, out, mode, alpha, target_kappa, epsilon):
        return
    flat = grid.reshape(batch, height * width, d).double()
    conditioned = token_correction(flat, mode, alpha, target_kappa, method, where, centred, add_tokens=True,
                                   grid_width=width, epsilon=epsilon)
    out.copy_(conditioned.view(grid.shape))


def condition_valid_regions(grid: torch.Tensor, valid_shapes: Sequence[Tuple[int, int]],
                            window_size: Optional[int] = None, shift_size: int = 0, detach: bool = True,
                            **kwargs) -> torch.Tensor:
    """Condition image b on the top-left ``valid_shapes[b]`` part of its token grid only; the other tokens
    (padding) pass unchanged.

    Args:
        grid (Tensor): token grids (B, H, W, d) of a padded batch.
        valid_shapes (Sequence[tuple[int, int]]): per image, the (h, w) of its valid tokens.
        window_size (int, optional): condition each attention window of the valid region on its own
            (:func:`condition_token_windows`; windows cut by the valid region keep their valid tokens).
            None: the valid region as one matrix. Default: None.
        shift_size (int): Swin's window shift, with ``window_size``. Default: 0.
        detach (bool): see :func:`condition_tokens`. Default: True.
        **kwargs: mode, alpha, target_kappa, method, where, centred, epsilon of :func:`condition_tokens`.

    Returns:
        Tensor: the conditioned grids, shape and dtype of ``grid``.
    """
    batch, height, width, channels = grid.shape
    regions = [(image, min(h, height), min(w, width)) for image, (h, w) in enumerate(valid_shapes)]
    if window_size is None and (detach or not torch.is_grad_enabled() or not grid.requires_grad):
        out = torch.empty(grid.shape, dtype=grid.dtype, device=grid.device)
        with torch.no_grad():
            for image, h, w in regions:  # padding copied as it is, the valid region conditioned in place
                out[image, h:] = grid[image, h:]
                out[image, :h, w:] = grid[image, :h, w:]
                if h and w:
                    write_conditioned(grid[image:image + 1, :h, :w].detach(), out[image:image + 1, :h, :w],
                                      **kwargs)
        return _ConstantCorrection.apply(grid, out) if torch.is_grad_enabled() and grid.requires_grad else out
    out = grid.clone(memory_format=torch.contiguous_format)
    for image, h, w in regions:
        if not (h and w):
            continue
        valid = grid[image:image + 1, :h, :w]
        if window_size is None:
            conditioned = condition_tokens(valid, detach=detach, **kwargs)
        else:
            conditioned = condition_token_windows(valid.reshape(1, h * w, channels), (h, w), window_size,
                                                  shift_size, detach=detach, **kwargs).view(1, h, w, channels)
        out[image:image + 1, :h, :w] = conditioned
    return out


def match_token_scale(x: torch.Tensor, conditioned: torch.Tensor, control: str,
                      valid_shapes: Optional[Sequence[Tuple[int, int]]] = None) -> torch.Tensor:
    """Token-scale control of the conditioning: r X (``'scale_matched'``) or (X + C) / r (``'norm_matched'``),
    with r = ||X + C||_F / ||X||_F of each image, computed in float64 and constant in backward.

    Args:
        x (Tensor): the tokens before conditioning, (B, N, d) or grids (B, H, W, d).
        conditioned (Tensor): X + C, same shape (from :func:`condition_tokens` or
            :func:`condition_valid_regions`).
        control (str): 'scale_matched' or 'norm_matched'.
        valid_shapes (Sequence[tuple[int, int]], optional): per image, the (h, w) of its valid tokens in a grid
            input: r is taken over them and only they are changed (the padding passes unchanged, as the
            conditioning leaves it). None: every token of the image. Default: None.

    Returns:
        Tensor: same shape and dtype as ``x``. An image whose X is zero gets r = 1 (X + C = X = 0).
    """
    if control not in TOKEN_SCALE_CONTROLS:
        raise ValueError(f'token-scale control must be one of {TOKEN_SCALE_CONTROLS}, got {control!r}')
    if conditioned.shape != x.shape:
        raise ValueError(f'match_token_scale: tokens {tuple(x.shape)} and conditioned tokens '
                         f'{tuple(conditioned.shape)} differ in shape')
    if valid_shapes is not None and x.dim() != 4:
        raise ValueError(f'match_token_scale: valid_shapes needs token grids (B, H, W, d), got {tuple(x.shape)}')
    batch = x.shape[0]
    with torch.no_grad():
        scale = torch.ones((batch, ) + (1, ) * (x.dim() - 1), dtype=torch.float64, device=x.device)
        if valid_shapes is None:
            scale = scale.expand((batch, ) + x.shape[1:-1] + (1, )).clone()
            regions = [(image, (slice(None), ) * (x.dim() - 2)) for image in range(batch)]
        else:
            scale = scale.expand(x.shape[:-1] + (1, )).clone()
            regions = [(image, (slice(0, h), slice(0, w))) for image, (h, w) in enumerate(valid_shapes)]
        for image, region in regions:
            tokens_norm = torch.linalg.vector_norm(x[image][region].double())
            if tokens_norm > 0:
                ratio = torch.linalg.vector_norm(conditioned[image][region].double()) / tokens_norm
                scale[image][region] = ratio
        scale = scale.to(x.dtype)
    # the scale is a constant: gradients are r I (scale-matched) or those of X + C times 1 / r (norm-matched)
    return x * scale if control == 'scale_matched' else conditioned / scale


class _ConstantCorrection(torch.autograd.Function):
    """X + C, computed outside autograd, with C a constant: the gradient w.r.t. X is the identity.

    Lets the conditioned tokens come out of one float64 product (X (I + M)) instead of X + C.to(dtype).
    """

    @staticmethod
    def forward(ctx, x, conditioned):
        return conditioned

    @staticmethod
    def backward(ctx, grad_out):
        return grad_out, None


class _DifferentiableCorrection(torch.autograd.Function):
    """C(X) with a gradient that stays finite at rank-deficient and repeated-spectrum inputs.

    Forward uses :func:`token_correction`. Backward differentiates C = U D(s) V^T through the thin SVD
    with the standard formulas, dropping the terms whose denominators (s_i^2 - s_j^2, s_i) vanish
    below a relative threshold; for a well-separated full-rank spectrum it is the exact derivative.
    """

    @staticmethod
    def forward(ctx, x, mode, alpha, target_kappa, method, centred, grid_width, epsilon):
        x64 = x.detach().double()
        ctx.save_for_backward(x64)
        ctx.options = (mode, alpha, target_kappa, centred, epsilon)
        return token_correction(x64, mode, alpha, target_kappa, method, centred=centred,
                                grid_width=grid_width, epsilon=epsilon).to(x.dtype)

    @staticmethod
    def backward(ctx, grad_c):
        (x64,) = ctx.saved_tensors
        mode, alpha, target_kappa, centred, epsilon = ctx.options
        with torch.enable_grad():
            xr = x64.detach().requires_grad_(True)
            if centred and xr.shape[-1] < 2:
                return torch.zeros_like(grad_c), None, None, None, None, None, None, None
            correction = (_from_channel_mean_complement(
                _correction_safe_svd(channel_mean_complement(xr), mode, alpha, target_kappa, epsilon)) if centred
                          else _correction_safe_svd(xr, mode, alpha, target_kappa, epsilon))
            (grad_x,) = torch.autograd.grad(correction, xr, grad_c.double())
        return grad_x.to(grad_c.dtype), None, None, None, None, None, None, None


class _SafeSVD(torch.autograd.Function):
    """Thin SVD whose backward ignores ill-defined (near-degenerate or near-null) terms."""

    @staticmethod
    def forward(ctx, x):
        u, s, vh = torch.linalg.svd(x, full_matrices=False)
        ctx.save_for_backward(u, s, vh)
        return u, s, vh

    @staticmethod
    def backward(ctx, gu, gs, gvh):
        u, s, vh = ctx.saved_tensors
        v = vh.transpose(-1, -2)
        gv = gvh.transpose(-1, -2)
        # Terms whose singular values differ (or vanish) by less than 1e-8 s_1 are ill-defined.
        eps = 1e-8 * s[..., :1].clamp_min(1e-300)
        s_i, s_j = s.unsqueeze(-1), s.unsqueeze(-2)
        denom = s_j ** 2 - s_i ** 2
        off = denom.abs() > eps.unsqueeze(-1) * (s_i + s_j)
        f = torch.where(off, 1 / torch.where(off, denom, torch.ones_like(denom)), torch.zeros_like(denom))
        ut_gu = u.transpose(-1, -2) @ gu
        vt_gv = v.transpose(-1, -2) @ gv
        j_u = f * (ut_gu - ut_gu.transpose(-1, -2))
        j_v = f * (vt_gv - vt_gv.transpose(-1, -2))
        s_diag = torch.diag_embed(s)
        inner = u @ (torch.diag_embed(gs) + j_u @ s_diag + s_diag @ j_v) @ vh
        live = s > eps
        inv_s = torch.where(live, 1 / torch.where(live, s, torch.ones_like(s)), torch.zeros_like(s))
        # (I - U U^T) gU S^-1 V^T + U S^-1 gV^T (I - V V^T), without forming the N x N projector
        gu_perp = gu - u @ ut_gu
        gvt_perp = gv.transpose(-1, -2) - vt_gv.transpose(-1, -2) @ vh
        outer_u = (gu_perp * inv_s.unsqueeze(-2)) @ vh
        outer_v = u @ (inv_s.unsqueeze(-1) * gvt_perp)
        return inner + outer_u + outer_v


def _correction_safe_svd(x: torch.Tensor, mode: str, alpha: float, target_kappa: float,
                         epsilon: float) -> torch.Tensor:
    u, s, vh = _SafeSVD.apply(x)
    return (u * _lift(s, s[..., :1], mode, alpha, target_kappa, epsilon).unsqueeze(-2)) @ vh


def _window_runs(length: int, window_size: int, shift_size: int) -> List[Tuple[int, int, int]]:
    """Cut one axis of ``length`` tokens into attention windows: runs of (start, count, window length).

    The cuts lie at ``shift_size + k * window_size``. With no shift these are the windows of a window
    partition from the top-left corner; with a shift they are the groups of tokens that attend to each
    other under Swin's cyclic shift and attention mask, in image coordinates (the wrapped-around window
    of the shifted frame is split by its mask into the strip before the first cut and the strip after
    the last one). Each run is a contiguous stretch of ``count`` windows of equal length: at most a
    head (before the first cut), a body of full windows and a tail cut by the border.
    """
    runs = []
    head = min(shift_size, length)
    if head:
        runs.append((0, 1, head))
    body = (length - head) // window_size
    if body:
        runs.append((head, body, window_size))
    tail = length - head - body * window_size
    if tail:
        runs.append((head + body * window_size, 1, tail))
    return runs


def token_windows(grid: torch.Tensor, window_size: int, shift_size: int = 0):
    """Yield ``(region, windows)`` for the attention windows of a (B, H, W, d) token grid.

    ``region`` is the (top, left, rows, cols, win_h, win_w) of a run of equal windows (see
    :func:`_window_runs`) and ``windows`` their token matrices as one (B * rows * cols, win_h * win_w, d)
    batch, image-major. Windows cut by the border hold only their real tokens.
    """
    batch, height, width, channels = grid.shape
    for (top, rows, win_h), (left, cols, win_w) in itertools.product(
            _window_runs(height, window_size, shift_size), _window_runs(width, window_size, shift_size)):
        region = grid[:, top:top + rows * win_h, left:left + cols * win_w]
        windows = region.reshape(batch, rows, win_h, cols, win_w, channels).permute(0, 1, 3, 2, 4, 5)
        yield (top, left, rows, cols, win_h, win_w), windows.reshape(-1, win_h * win_w, channels)


def condition_token_windows(x: torch.Tensor, hw_shape: Tuple[int, int], window_size: int,
                            shift_size: int = 0, where: str = 'condition_token_windows',
                            **kwargs) -> torch.Tensor:
    """Condition the token matrix of every attention window on its own: kappa <= target_kappa per window.

    The windows are those of a windowed-attention block (Swin's W-MSA/SW-MSA, ViTDet's window blocks):
    ``window_size`` x ``window_size`` tiles from the top-left corner of the (H, W) token grid, moved by
    ``shift_size`` as Swin's shifted windows are (see :func:`_window_runs`). The attention pads the grid
    to a multiple of the window size with zero tokens (after its LayerNorm); those padded tokens are not
    part of any window's matrix here: a window cut by the border is conditioned as the matrix of its
    real tokens only (fewer rows), and conditioning the padding would be undone anyway, since the
    attention pads again with zeros. A window of n tokens is an n x d matrix.

    All windows of one shape, across the whole batch, are conditioned by one batched
    :func:`condition_tokens` call: one call when the grid is a multiple of the window size, at most four
    (interior, right border, bottom border, corner) otherwise, at most nine with a shift.

    Args:
        x (Tensor): tokens of shape (B, H*W, d), row-major over the (H, W) grid.
        hw_shape (tuple[int, int]): the grid (H, W).
        window_size (int): side of the square attention window, >= 1.
        shift_size (int): Swin's window shift, 0 <= shift_size < window_size. Default: 0.
        where (str): a name for error messages.
        **kwargs: mode, alpha, target_kappa, detach, method, centred, epsilon of :func:`condition_tokens`.

    Returns:
        Tensor: the conditioned tokens, shape and dtype of ``x``.
    """
    if not (isinstance(window_size, int) and window_size >= 1):
        raise ValueError(f'{where}: window_size must be an integer >= 1, got {window_size!r}')
    if not (isinstance(shift_size, int) and 0 <= shift_size < window_size):
        raise ValueError(f'{where}: shift_size must be an integer in [0, window_size={window_size}), '
                         f'got {shift_size!r}')
    if x.dim() != 3:
        raise ValueError(f'{where}: expected tokens of shape (B, H*W, d), got {tuple(x.shape)}')
    height, width = hw_shape
    batch, num_tokens, channels = x.shape
    if num_tokens != height * width:
        raise ValueError(f'{where}: {num_tokens} tokens do not fill the grid hw_shape={tuple(hw_shape)} '
                         f'({height} x {width} = {height * width})')
    grid = x.reshape(batch, height, width, channels)
    out = grid.new_empty(grid.shape)
    for (top, left, rows, cols, win_h, win_w), windows in token_windows(grid, window_size, shift_size):
        conditioned = condition_tokens(windows, where=where, **kwargs)
        out[:, top:top + rows * win_h, left:left + cols * win_w] = conditioned.view(
            batch, rows, cols, win_h, win_w, channels).permute(0, 1, 3, 2, 4, 5).reshape(
                batch, rows * win_h, cols * win_w, channels)
    return out.view(batch, num_tokens, channels)


def condition_number(x: torch.Tensor) -> torch.Tensor:
    """kappa = s_max / s_min of each token matrix, computed in float64.

    Args:
        x (Tensor): (B, N, d) or (N, d).

    Returns:
        Tensor: float64 of shape (B,) (or a scalar for 2-D input); ``inf`` for a singular matrix, the
        zero matrix included. Non-finite input raises ValueError.
    """
    if x.dim() not in (2, 3):
        raise ValueError(f'condition_number: expected (B, N, d) or (N, d), got {tuple(x.shape)}')
    _check_finite(x, 'condition_number')
    s = torch.linalg.svdvals(x.detach().double())
    s_max, s_min = s[..., 0], s[..., -1]
    return torch.where(s_min > 0, s_max / torch.where(s_min > 0, s_min, torch.ones_like(s_min)),
                       torch.full_like(s_max, math.inf))
