"""Spectral functions of a stack of symmetric positive semi-definite d x d matrices from matmuls only (no eigensolver,
no host sync): an upper bound on the largest eigenvalue, and the inverse square root.

Both iterate a fixed number of times, chosen from a priori bounds so that no convergence test (a host read) is
needed; every step is a batched matmul, the same program for every matrix of the stack.
"""
import math

import torch

# lambda_max <= trace(A^p)^(1/p) <= d^(1/p) lambda_max for p = 2^_SQUARINGS: 2^24 bounds the overestimate by
# ln(d) / 2^24 (4e-7 relative at d = 768), below what the float64 Gram matrix resolves of kappa anyway.
_SQUARINGS = 24


def largest_eigenvalue_bound(gram: torch.Tensor, squarings: int = _SQUARINGS) -> torch.Tensor:
    """An upper bound u on the largest eigenvalue of each PSD matrix of ``gram`` (..., d, d), with
    u <= d^(2^-squarings) lambda_max: u = trace(A^p)^(1/p), p = 2^squarings, by repeated squaring normalised by
    the trace (so nothing overflows; the log of the scale is carried). Zero matrices give 0."""
    trace = gram.diagonal(dim1=-2, dim2=-1).sum(-1)
    scale = torch.where(trace > 0, trace, torch.ones_like(trace))
    power = gram / scale[..., None, None]
    log_trace = torch.zeros_like(trace)  # log trace(A^p) - p log trace(A), divided by p
    weight = 1.0
    for _ in range(squarings):
        # trace(P^2) = ||P||_F^2 for the symmetric P: the next power's trace before it is formed
        step = power.square().sum(dim=(-2, -1))
        step = torch.where(step > 0, step, torch.ones_like(step))
        weight /= 2
        log_trace = log_trace + weight * torch.log(step)
        power = (power @ power) / step[..., None, None]
    return torch.where(trace > 0, trace * torch.exp(log_trace), torch.zeros_like(trace))


def newton_schulz_steps(smallest: float) -> int:
    """Steps of :func:`inverse_sqrt_newton_schulz` after which an eigenvalue >= ``smallest`` (of a matrix scaled
    to eigenvalues <= 1) has converged to float64 round-off: p -> p (3 - p)^2 / 4 from p = smallest, to 1 - 1e-15."""
    p, steps = smallest, 0
    while 1 - p > 1e-15:
        p, steps = p * (3 - p) ** 2 / 4, steps + 1
    return steps


def inverse_sqrt_newton_schulz(gram: torch.Tensor, upper: torch.Tensor, steps: int) -> torch.Tensor:
    """(G / u)^(-1/2) / sqrt(u) = G^(-1/2) for PSD ``gram`` (..., d, d) with eigenvalues in (0, u], ``upper`` u,
    by the coupled Newton-Schulz iteration Y <- Y T, Z <- T Z, T = (3 I - Z Y) / 2 from Y = G / u, Z = I (Z tends
    to (G / u)^(-1/2); each step multiplies an eigenvalue's distance to convergence down, quadratically near 1).
    An eigenvalue that is 0 (a structurally rank-deficient G) is not inverted: Z grows there by 1.5 per step,
    to a finite value that a caller multiplying by the matrix whose Gram matrix G is annihilates."""
    u = torch.where(upper > 0, upper, torch.ones_like(upper))[..., None, None]
    eye = torch.eye(gram.shape[-1], dtype=gram.dtype, device=gram.device).expand_as(gram)
    y = gram / u
    z = eye
    three_halves = 1.5 * eye
    for _ in range(steps):
        t = torch.baddbmm(three_halves, z, y, alpha=-0.5)
        y = y @ t
        z = t @ z
    return 0.5 * (z + z.transpose(-1, -2)) / u.sqrt()
