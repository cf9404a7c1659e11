"""The matmul-only spectral functions of the Newton-Schulz solver: the step schedule converges every eigenvalue
down to its floor in fewer steps than the plain iteration, the inverse square root equals the float64 eigh one
wherever float64 resolves it, and the products they dispatch are counted."""
import math

import numpy as np
import pytest
import torch
from scipy import optimize
from torch.utils._python_dispatch import TorchDispatchMode

from condtok_mm.conditioning import matrix_functions
from condtok_mm.conditioning.batched import _NEWTON_SCHULZ_STEPS, SHIFT, TAU

PLAIN_STEPS = 62  # the unscaled cubic iteration p -> p (3 - p)^2 / 4 from 1e-20 to within 1e-15 of 1


def plain_steps(smallest):
    p, steps = smallest, 0
    while 1 - p > 1e-15:
        p, steps = p * (3 - p) ** 2 / 4, steps + 1
    return steps


def run_schedule(x, steps):
    """x = sqrt(p) through the steps (a0, a1, b): x -> x q(x^2), q(y) = sum_j b[j] (a0 + a1 y)^j."""
    for a0, a1, b in steps:
        x = x * sum(c * (a0 + a1 * x * x) ** j for j, c in enumerate(b))
    return x


@pytest.mark.parametrize('smallest', [1e-20, 1e-10, 0.5])
def test_the_schedule_brings_every_eigenvalue_of_its_range_to_one_in_fewer_products(smallest):
    steps = matrix_functions.newton_schulz_schedule(smallest)
    x = torch.logspace(math.log10(smallest), 0, 4000, dtype=torch.float64).sqrt()
    # within 1e-15 of 1, plus the few eps of round-off of evaluating the polynomials here
    assert (1 - run_schedule(x, steps) ** 2).abs().max() <= 1e-15 + 4 * torch.finfo(torch.float64).eps
    assert 5 * len(steps) < 3 * plain_steps(smallest)
    assert plain_steps(1e-20) == PLAIN_STEPS and len(matrix_functions.newton_schulz_schedule(1e-20)) == 15
    assert _NEWTON_SCHULZ_STEPS == matrix_functions.newton_schulz_schedule(SHIFT * TAU**2)


def test_the_growth_step_never_grows_past_one_nor_collapses_the_top_and_grows_the_bottom_six_fold():
    # what the schedule assumes of it: a step maps [l, 1.02] into [min(p(l), GROWTH_FLOOR), 1]
    x = torch.linspace(0, 1.02, 2_000_001, dtype=torch.float64)
    p = matrix_functions._growth(x)
    assert p.max() <= 1 + 1e-12
    rising = x <= 0.262
    assert (p[rising].diff() > 0).all() and (p[rising][1:] > x[rising][1:]).all()
    assert p[~rising].min() >= matrix_functions.GROWTH_FLOOR
    assert matrix_functions.GROWTH[0] > 6.2  # p'(0): a small eigenvalue grows 38-fold in p = x^2 a step


def test_eigenvalues_up_to_two_percent_above_the_bound_still_converge():
    # room for round-off in the lambda_max bound and in the iteration
    x = torch.linspace(1, 1.02, 2001, dtype=torch.float64)
    assert (1 - run_schedule(x, _NEWTON_SCHULZ_STEPS) ** 2).abs().max() <= 1e-15 + 4 * torch.finfo(torch.float64).eps


def test_the_growth_step_has_the_largest_slope_its_constraints_allow():
    # re-derived by the linear programme its comment describes: the shipped polynomial is within 1e-3 of its optimum
    x = np.unique(np.concatenate([np.linspace(0, 1.02, 20000)[1:], np.geomspace(1e-4, 1, 2000)]))
    powers = np.stack([x ** (2 * k + 1) for k in range(5)], 1)
    lower = np.minimum(x, 0.6)
    result = optimize.linprog([-1, 0, 0, 0, 0], A_ub=np.concatenate([powers, -powers]),
                              b_ub=np.concatenate([np.ones_like(x), -lower]), bounds=[(None, None)] * 5,
                              method='highs')
    assert result.success
    optimum = result.x[0] / (powers @ result.x).max()
    assert abs(matrix_functions.GROWTH[0] / optimum - 1) <= 1e-3


def spread_gram(d, smallest, seed=0):
    """PSD matrices Q diag(lambda) Q^T with lambda from 1 down to ``smallest``, and their float64 Q and lambda."""
    generator = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(3, d, d, dtype=torch.float64, generator=generator))
    lam = torch.logspace(0, math.log10(smallest), d, dtype=torch.float64)
    return q @ torch.diag_embed(lam.expand(3, d)) @ q.transpose(-1, -2), q, lam


@pytest.mark.parametrize('smallest, tolerance', [(1e-8, 1e-8), (1e-12, 1e-4)])
def test_the_inverse_square_root_equals_eighs_on_each_eigenvector(smallest, tolerance):
    # float64 holds G to eps of its largest eigenvalue, so an eigenvalue 1e-12 of it is known to about 1e-4
    gram, q, lam = spread_gram(48, smallest)
    upper = matrix_functions.largest_eigenvalue_bound(gram)
    assert (upper >= lam[0] * (1 - 1e-14)).all() and (upper <= lam[0] * (1 + 1e-5)).all()  # G holds 1 to eps
    z = matrix_functions.inverse_sqrt_newton_schulz(gram, upper, _NEWTON_SCHULZ_STEPS)
    on_eigenvectors = (q.transpose(-1, -2) @ z @ q).diagonal(dim1=-2, dim2=-1) * lam.sqrt()  # 1 for G^(-1/2)
    assert (on_eigenvectors - 1).abs().max() <= tolerance
    short = matrix_functions.inverse_sqrt_newton_schulz(gram, upper, _NEWTON_SCHULZ_STEPS[:-2])
    assert ((q.transpose(-1, -2) @ short @ q).diagonal(dim1=-2, dim2=-1) * lam.sqrt() - 1).abs().max() > tolerance


class CountProducts(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.products = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.products += func.overloadpacket in (torch.ops.aten.bmm, torch.ops.aten.baddbmm, torch.ops.aten.baddbmm_,
                                                 torch.ops.aten.mm)
        return func(*args, **(kwargs or {}))


def test_the_solver_runs_91_products_where_the_plain_iteration_runs_205():
    gram, _, _ = spread_gram(16, 1e-6)
    with CountProducts() as count:
        upper = matrix_functions.largest_eigenvalue_bound(gram)
        matrix_functions.inverse_sqrt_newton_schulz(gram, upper, _NEWTON_SCHULZ_STEPS)
    # 5 a step but 3 in the first (P = Y, Z = T) and 4 in the last (no Y T), one per squaring of the lambda_max
    # bound but the last
    steps = len(_NEWTON_SCHULZ_STEPS)
    assert count.products == 5 * steps - 3 + matrix_functions._SQUARINGS - 1 == 91
    assert count.products < 3 * PLAIN_STEPS + matrix_functions._SQUARINGS - 1 == 205
