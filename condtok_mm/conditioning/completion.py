"""The reference path's canonical null-space completion: fixed band and DCT-II candidates, projected out of
range(X) and rotated to the basis closest to the candidates, so that X + C does not depend on the eigensolver."""
import math
from typing import List, Optional, Tuple

import torch

# Extra candidate vectors for the null-space completion, so that a few candidates that happen to lie
# (almost) in range(X) still leave k good ones.
_COMPLETION_OVERSAMPLING = 4


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

