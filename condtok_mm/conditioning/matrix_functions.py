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
# 1e-4 that the tests hold the Newton-Schulz and eigh results to. Each squaring halves that overestimate and costs
# one d x d product.
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


# The growth step: the odd degree-9 polynomial p(x) = sum_k GROWTH[k] x^(2k+1) with the largest slope p'(0) under
# p <= 1 on [0, 1.02], p(x) >= x on [0, 0.6] and p >= 0.6 on [0.6, 1.02] (on the grid), found by linear programming on
# a grid of 20000 points (scipy's HiGHS) and divided by its largest value. It grows a small x 6.21-fold for 5
# products, where a cubic step with scale 2 grows it 2.12-fold for 3. It maps every x to at least min(x,
# GROWTH_FLOOR): the top eigenvalues are not pushed towards 0, where Y and Z shrink along them and round-off from the
# other directions moves the result (cubic steps with scales near 3, which do that, moved it by 1e-4). The 2 % above
# 1 is room for round-off in u and in the iteration: past it p exceeds 1 and grows fast (p(1.03) = 1.19, and an x
# that starts there diverges), where a margin of 0.1 % would have given a slope of 6.35 and the same 15 steps.
GROWTH = (6.205071721396333, -42.47216834980596, 121.29771039148154, -141.09997672637311, 56.81541399563512)
# p is increasing on [0, 0.262] and at least GROWTH_FLOOR on [0.262, 1.02] (its local minimum 0.5645 at x = 0.546).
GROWTH_FLOOR = 0.56
# The finishing steps: the degree-9 Taylor polynomial of x / |x| at 1, g(x) = x sum_j TAYLOR[j] (1 - x^2)^j,
# TAYLOR[j] = binom(2j, j) / 4^j, taken at sqrt(s) x with s >= 1 chosen per step. g is increasing (g'(x) is
# proportional to (1 - x^2)^4), so a step maps [l, 1] onto [g(sqrt(s) l), g(sqrt(s))] exactly; it converges with
# order 5 near 1.
TAYLOR = tuple(math.comb(2 * j, j) / 4**j for j in range(5))
# Steps end when every eigenvalue p = x^2 of the residual is within this of 1.
CONVERGED = 1e-15


def _growth(x: float) -> float:
    return sum(c * x ** (2 * k + 1) for k, c in enumerate(GROWTH))


def _taylor(x: float, scale: float) -> float:
    return math.sqrt(scale) * x * sum(c * (1 - scale * x * x) ** j for j, c in enumerate(TAYLOR))


def _finishing_scale(floor: float) -> float:
    """The s in [1, min(4, 1 / floor^2)] that maximises the new floor g(sqrt(s) floor) / g(sqrt(s)) (unimodal in s:
    a ternary search; the best s stays below 2 from any floor the growth steps leave)."""
    low, high = 1.0, min(4.0, 1 / floor**2)
    for _ in range(200):
        left, right = low + (high - low) / 3, high - (high - low) / 3
        if _taylor(floor, left) / _taylor(1.0, left) < _taylor(floor, right) / _taylor(1.0, right):
            low = left
        else:
            high = right
    return (low + high) / 2


def newton_schulz_schedule(smallest: float) -> tuple:
    """The steps of :func:`inverse_sqrt_newton_schulz` that bring every eigenvalue of the residual in
    [``smallest``, 1] to 1 within float64 round-off (1 - p <= CONVERGED).

    In x = sqrt(p), a step with residual polynomial q maps x to x q(x^2), and Z's eigenvalue is multiplied by q(x^2).
    Each step is (a0, a1, b): q(P) = sum_j b[j] R^j with R = a0 I + a1 P. Growth steps (GROWTH: a0 = 0, a1 = 1)
    run while the floor l is below GROWTH_FLOOR, mapping it to p(l); then finishing steps (the Taylor polynomial
    at sqrt(s) x, divided by its value at 1 so that the top stays at 1: a0 = 1, a1 = -s) until the floor converges.
    From 1e-20 that is 12 growth and 3 finishing steps (5 products each), where the scaled cubic steps took 35
    (3 products each) and the plain ones 62.
    """
    floor, steps = math.sqrt(smallest), []
    while _growth(floor) < GROWTH_FLOOR:
        floor = _growth(floor)
        steps.append((0.0, 1.0, GROWTH))
    floor = min(floor, GROWTH_FLOOR)
    while 1 - floor**2 > CONVERGED:
        scale = _finishing_scale(floor)
        top = _taylor(1.0, scale)
        floor = _taylor(floor, scale) / top
        steps.append((1.0, -scale, tuple(math.sqrt(scale) * c / top for c in TAYLOR)))
    return tuple(steps)


def inverse_sqrt_newton_schulz(gram: torch.Tensor, upper: torch.Tensor, steps: tuple) -> torch.Tensor:
    """(G / u)^(-1/2) / sqrt(u) = G^(-1/2) for PSD ``gram`` (S, d, d) with eigenvalues in (0, u], ``upper`` u (S,),
    by the coupled Newton-Schulz iteration Y <- Y T, Z <- T Z, T = q(Z Y), from Y = G / u, Z = I, one step per
    entry (a0, a1, b) of ``steps`` (:func:`newton_schulz_schedule`, at least one): q(P) = sum_j b[j] R^j,
    R = a0 I + a1 P.
    Y = (G / u) Z holds throughout, and the residual P = Z Y goes to P q(P)^2, so Z tends to (G / u)^(-1/2) as P
    tends to I. Five products a step (P, R^2, R^2 (b2 I + b3 R + b4 R^2), Y T, T Z); the first step has P = Y and
    Z = T, and the last needs no Y. An eigenvalue that is 0 (a structurally rank-deficient G) is not inverted: Z
    grows there by q(0) per step, to a finite value that a caller multiplying by the matrix whose Gram matrix G is
    annihilates."""
    u = torch.where(upper > 0, upper, torch.ones_like(upper))[..., None, None]
    y = gram / u
    z = None
    for index, (a0, a1, b) in enumerate(steps):
        t = _step_matrix(y, a0, a1, b) if z is None else _step_matrix(z @ y, a0, a1, b, overwrite=True)
        if index < len(steps) - 1:
            y = y @ t
        z = t if z is None else t @ z
    return 0.5 * (z + z.transpose(-1, -2)) / u.sqrt()


def _step_matrix(residual: torch.Tensor, a0: float, a1: float, b: tuple, overwrite: bool = False) -> torch.Tensor:
    """T = b0 I + b1 R + R^2 (b2 I + b3 R + b4 R^2), R = a0 I + a1 P for the residual P (written over where
    ``overwrite``): two products, the additions fused into the second one and into the diagonals (a full-size
    elementwise pass over a d x d stack costs 2-4 % of a product on the CPU), and the temporaries freed on
    return, before Y T and T Z: the iteration holds at most five d x d matrices per image. In place, so not for
    autograd (the batched path conditions detached tokens)."""
    if (a0, a1) != (0.0, 1.0):
        residual = residual.mul_(a1) if overwrite else residual * a1
        residual.diagonal(dim1=-2, dim2=-1).add_(a0)
        overwrite = True
    r = residual
    r2 = r @ r
    inner = r2 * b[4]
    inner.add_(r, alpha=b[3]).diagonal(dim1=-2, dim2=-1).add_(b[2])
    t = r.baddbmm_(r2, inner, beta=b[1]) if overwrite else torch.baddbmm(r, r2, inner, beta=b[1])
    t.diagonal(dim1=-2, dim2=-1).add_(b[0])
    return t


def polar_refinement_step(rows: torch.Tensor, lift: torch.Tensor) -> torch.Tensor:
    """One cubic Newton-Schulz step toward the polar factor, for ``rows`` R = c Q (S, m, n), m <= n, ``lift`` c
    (S,): c Q' with Q' = (3 Q - Q Q^T Q) / 2, which maps each singular value q of Q to q (3 - q^2) / 2 (1 - q' =
    (1 - q)^2 (2 + q) / 2: an error of 1e-3 becomes 1.5e-6). Formed from R itself, whose Gram matrix R R^T is
    well conditioned where Q's singular values are near 1, so it corrects what an inverse square root of a Gram
    matrix with eigenvalues near its round-off got wrong. Two products; zero rows stay zero; c = 0 gives R."""
    scale = (0.5 / torch.where(lift > 0, lift, torch.ones_like(lift))**2)[:, None, None]
    return torch.baddbmm(rows, (rows @ rows.transpose(-1, -2)) * scale, rows, beta=1.5, alpha=-1)

