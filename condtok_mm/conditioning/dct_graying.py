"""Token Graying's DCT form: the SVD form's map, with the token grid's 2-D DCT-II standing in for U.

For the valid h x w token grid of one image, X (N = h w tokens x d channels, row-major) and Phi = Phi_h (x) Phi_w the
orthonormal 2-D DCT-II basis of the grid (N x N), the coefficients Y = Phi^T X have one row per spatial frequency k,
of norm n_k = ||Y_k||. The DCT form takes the frequencies for the left singular vectors and their norms for the
singular values:

    X + C = (1 - alpha) X + alpha Phi diag(g_k / n_k) Phi^T X,   g_k = (n_k / n_max)^eps

with g_k = 0 where n_k <= RANK_RTOL n_max (as the SVD form maps round-off-level singular values to 0). Where X's left
singular vectors are DCT vectors (X = Phi_S S V^T for a set S of frequencies), Y's rows are orthogonal, n_k are the
singular values and this is exactly the SVD form U (S / s_1)^eps V^T; otherwise it is the approximation that the
DCT makes of the eigenbasis of a spatially stationary field. It needs no eigendecomposition: two separable
transforms of the grid, one along each axis, and a norm per frequency. They are orthogonal (no squared condition
number, unlike a Gram matrix), so they run in float32 for float32/16 tokens and in float64 for float64 tokens; with
autocast off, which would otherwise run the float32 products in its lower precision (bfloat16: 1e-3 of ||C||).

Padded batches: each image's own valid region is transformed (its basis is the DCT of its own h and w, zero beyond
them, made on the device from the sizes: no host read, the same program for any sizes), so the result does not
depend on its batch-mates' padding; the padding passes unchanged. The DCT needs the grid, so this form conditions
whole images only (not attention windows, and not token matrices without their grid).
"""
import math

import torch

from .modes import _grayed


def dct_bases(sizes: torch.Tensor, length: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Orthonormal DCT-II bases (B, length, length), made in float64 and returned in ``dtype``: column k of
    ``bases[b]`` is the k-th DCT-II vector of length ``sizes[b]``, c_k cos(pi (2 i + 1) k / (2 n)) at positions i < n = sizes[b] (c_0 = sqrt(1/n), else
    sqrt(2/n)), and zero at i >= n or k >= n."""
    position = torch.arange(length, device=sizes.device, dtype=torch.float64)
    n = sizes.to(torch.float64).clamp_min(1)[:, None, None]
    i, k = position[None, :, None], position[None, None, :]
    scale = torch.where(k == 0, (1 / n).sqrt(), (2 / n).sqrt())
    inside = (i < n) & (k < n) & (sizes[:, None, None] > 0)
    return torch.where(inside, scale * torch.cos(math.pi * (2 * i + 1) * k / (2 * n)), 0.0).to(dtype)


def dct_graying(grid: torch.Tensor, bases_h: torch.Tensor, bases_w: torch.Tensor, alpha, epsilon: float
                ) -> torch.Tensor:
    """X + C of the DCT form (see the module) for grids (B, H, W, d) that are zero outside their valid regions and
    finite, with the DCT bases of those regions (:func:`dct_bases`, in the grids' dtype). Zero outside the regions.
    """
    with torch.autocast(grid.device.type, enabled=False):  # the products in the grids' own dtype
        # each grid scaled to a largest magnitude of 1, so that no square overflows: (g_k / n_k) Phi_k^T X does not
        # depend on X's scale
        scale = torch.linalg.vector_norm(grid, ord=math.inf, dim=(1, 2, 3))
        tokens = grid / torch.where(scale > 0, scale, torch.ones_like(scale))[:, None, None, None]
        coefficients = _transform(tokens, bases_h.transpose(1, 2), bases_w.transpose(1, 2))  # Phi^T X, (B, W, H, d)
        norms = torch.linalg.vector_norm(coefficients, dim=-1)  # n_k, zero outside the valid frequencies
        largest = norms.amax(dim=(1, 2), keepdim=True)
        # g_k / n_k, 0 where n_k is round-off (and outside the valid frequencies)
        gain = _grayed(norms, largest, epsilon) / norms.clamp_min(torch.finfo(norms.dtype).tiny)
        grayed = _transform(coefficients * gain.unsqueeze(-1), bases_w, bases_h)  # back to (B, H, W, d)
        return (1 - alpha) * grid + alpha * grayed


def _transform(grid: torch.Tensor, first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    """``first`` (B, P, P) applied along axis 1 of ``grid`` (B, P, Q, d) and ``second`` (B, Q, Q) along axis 2, as two
    batched products (2 P Q (P + Q) d flops); the result comes with the two axes swapped, (B, Q, P, d), contiguous."""
    batch, rows, cols, channels = grid.shape
    along_first = torch.bmm(first, grid.reshape(batch, rows, cols * channels))
    swapped = along_first.view(batch, rows, cols, channels).transpose(1, 2).reshape(batch, cols, rows * channels)
    return torch.bmm(second, swapped).view(batch, cols, rows, channels)
