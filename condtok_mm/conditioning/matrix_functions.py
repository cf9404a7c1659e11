"""Spectral functions of a stack of symmetric positive semi-definite d x d matrices from matmuls only (no eigensolver,
no host sync): an upper bound on the largest eigenvalue, and the inverse square root.

Both iterate a fixed number of times, chosen from a priori bounds so that no convergence test (a host read) is
needed; every step is a batched matmul, the same program for every matrix of the stack.
"""
import math

import torch

# lambda_max <= trace(A^p)^(1/p) <= d^(1/p) lambda_max for p = 2^_SQUARINGS: 2^20 bounds the overestimate by
# ln(d) / 2^20 (6e-6 relative at d = 768, 3e-6 on s_1 and on the correction c = s_1 / (t - 1)): an upper bound, so
# kappa(X + C) <= t holds whatever it is, and it moves the correction by at most 3e-6 relative, well inside the
# 1e-4 that the tests hold the Newton-Schulz and eigh results to. Each squaring halves that overestimate and costs one d x d product.
_SQUARINGS = 20


def largest_eigenvalue_bound(gram: torch.Tensor, squarings: int = _SQUARINGS) -> torch.Tensor:
    """An upper bound u on the largest eigenvalue of each PSD matrix of ``gram`` (..., d, d), with
    u <= d^(2^-squarings) lambda_max: u = trace(A^p)^(1/p), p = 2^squarings, by repeated squaring normalised by
    the trace (so nothing overflows; the log of the scale is carried). Zero matrices give 0."""
    trace = gram.diagonal(dim1=-2, dim2=-1).sum(-1)
    scale = torch.where(trace > 0, trace, torch.ones_like(trace))
    power = gram / scale[..., None, None]
    log_trace = torch.zeros_like(trace)  # log trace(A^p) - p log trace(A), divided by p
    weight = 1.0
    for squaring in range(squarings):
        # trace(P^2) = ||P||_F^2 for the symmetric P: the next power's trace before it is formed, so the last
        # squaring needs no product
        step = power.square().sum(dim=(-2, -1))
        step = torch.where(step > 0, step, torch.ones_like(step))
        weight /= 2
        log_trace = log_trace + weight * torch.log(step)
        if squaring < squarings - 1:
            power = (power @ power) / step[..., None, None]
    return torch.where(trace > 0, trace * torch.exp(log_trace), torch.zeros_like(trace))


def _residual_step(p: float) -> float:
    """What one Newton-Schulz step does to an eigenvalue p of the residual P = Z Y: p (3 - p)^2 / 4."""
    return p * (3 - p) ** 2 / 4


# The largest scale of P a step may take. f(p) = p (3 - p)^2 / 4 stays in (0, 1] for all of (0, 3), but a scale
# near 3 maps P's top eigenvalues near 0: Y and Z shrink by 1e-6 along them while they are ~1e7 along the smallest,
# and round-off from those directions then moves the result by 1e-4 relative (the L x L and d x d sides of one
# matrix disagreed by 2e-4). At 2 the top eigenvalues at most halve (f(2) = 1/2) and the results agree with the
# plain iteration's to round-off, in 35 steps instead of 62.
_MAX_SCALE = 2.0


def newton_schulz_schedule(smallest: float) -> tuple:
    """The scales s_k of the steps of :func:`inverse_sqrt_newton_schulz` that bring every eigenvalue of the residual
    in [``smallest``, 1] to 1 within float64 round-off (1 - p <= 1e-15), as few as a per-step choice allows.

    Step k maps an eigenvalue p of P to f(s_k p), f(p) = p (3 - p)^2 / 4: increasing on [0, 1], decreasing on
    [1, 3]. With P's eigenvalues in [l, 1] (1 stays the top: f(1) = 1 and 1 lies in [s l, s]), s_k maximises the
    smallest image min(f(s l), f(s)) over s in [1, min(_MAX_SCALE, 1 / l)]: where f(s l) = f(s) (a bisection),
    or at that bound. The new floor is l' = min(f(s l), f(s)). While l is small, s is at its bound (_MAX_SCALE) and
    l grows by 9/4 s = 9/2 a step instead of the unscaled 9/4, so an eigenvalue 1e-20 of the largest converges in
    35 steps instead of 62; near convergence s tends to 1 (the unscaled step, quadratic there).
    """
    floor, scales = smallest, []
    while 1 - floor > 1e-15:
        low, high = 1.0, min(_MAX_SCALE, 1 / floor)
        if _residual_step(high * floor) <= _residual_step(high):
            scale = high
        else:
            for _ in range(100):  # f(s l) - f(s) increases with s on [low, high]
                middle = (low + high) / 2
                if _residual_step(middle * floor) < _residual_step(middle):
                    low = middle
                else:
                    high = middle
            scale = low
        floor = min(_residual_step(scale * floor), _residual_step(scale))
        scales.append(scale)
    return tuple(scales)


def inverse_sqrt_newton_schulz(gram: torch.Tensor, upper: torch.Tensor, scales: tuple) -> torch.Tensor:
    """(G / u)^(-1/2) / sqrt(u) = G^(-1/2) for PSD ``gram`` (..., d, d) with eigenvalues in (0, u], ``upper`` u,
    by the scaled coupled Newton-Schulz iteration Y <- Y T, Z <- T Z, T = sqrt(s) (3 I - s Z Y) / 2 from
    Y = G / u, Z = I, one step per scale s of ``scales`` (:func:`newton_schulz_schedule`). Y = (G / u) Z holds
    throughout, and the residual P = Z Y goes to f(s P), f(p) = p (3 - p)^2 / 4, so Z tends to (G / u)^(-1/2) as P
    tends to I (s = 1 is the plain step; a larger s grows P's small eigenvalues s times as fast). An eigenvalue
    that is 0 (a structurally rank-deficient G) is not inverted: Z grows there by 1.5 sqrt(s) per step, to a
    finite value that a caller multiplying by the matrix whose Gram matrix G is annihilates."""
    u = torch.where(upper > 0, upper, torch.ones_like(upper))[..., None, None]
    eye = torch.eye(gram.shape[-1], dtype=gram.dtype, device=gram.device).expand_as(gram)
    y = gram / u
    z = eye
    for scale in scales:
        root = math.sqrt(scale)
        t = torch.baddbmm(eye, z, y, beta=1.5 * root, alpha=-0.5 * scale * root)
        y = y @ t
        z = t @ z
    return 0.5 * (z + z.transpose(-1, -2)) / u.sqrt()
