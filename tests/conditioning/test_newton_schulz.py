"""The matmul-only spectral functions of the Newton-Schulz solver: the step schedule converges every eigenvalue
down to its floor in fewer steps than the plain iteration, the inverse square root equals the float64 eigh one
wherever float64 resolves it, and the products they dispatch are counted."""
import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from condtok_mm.conditioning import matrix_functions
from condtok_mm.conditioning.batched import _NEWTON_SCHULZ_SCALES, SHIFT_FULL, TAU

PLAIN_STEPS = 62  # the unscaled iteration p -> p (3 - p)^2 / 4 from 1e-20 to within 1e-15 of 1


def plain_steps(smallest):
    p, steps = smallest, 0
    while 1 - p > 1e-15:
        p, steps = p * (3 - p) ** 2 / 4, steps + 1
    return steps


@pytest.mark.parametrize('smallest', [1e-20, 1e-10, 0.5])
def test_the_schedule_brings_every_eigenvalue_of_its_range_to_one_in_fewer_steps(smallest):
    scales = matrix_functions.newton_schulz_schedule(smallest)
    assert all(1 <= s <= matrix_functions._MAX_SCALE for s in scales)
    assert len(scales) < plain_steps(smallest)
    for p in torch.logspace(math.log10(smallest), 0, 400, dtype=torch.float64).tolist():
        for s in scales:
            p = s * p * (3 - s * p) ** 2 / 4
        assert abs(1 - p) <= 1e-15
    assert plain_steps(1e-20) == PLAIN_STEPS and len(matrix_functions.newton_schulz_schedule(1e-20)) == 35
    assert _NEWTON_SCHULZ_SCALES == matrix_functions.newton_schulz_schedule(SHIFT_FULL * TAU**2)


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
    z = matrix_functions.inverse_sqrt_newton_schulz(gram, upper, _NEWTON_SCHULZ_SCALES)
    on_eigenvectors = (q.transpose(-1, -2) @ z @ q).diagonal(dim1=-2, dim2=-1) * lam.sqrt()  # 1 for G^(-1/2)
    assert (on_eigenvectors - 1).abs().max() <= tolerance
    short = matrix_functions.inverse_sqrt_newton_schulz(gram, upper, _NEWTON_SCHULZ_SCALES[:-4])
    assert ((q.transpose(-1, -2) @ short @ q).diagonal(dim1=-2, dim2=-1) * lam.sqrt() - 1).abs().max() > tolerance


class CountProducts(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.products = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.products += func.overloadpacket in (torch.ops.aten.bmm, torch.ops.aten.baddbmm, torch.ops.aten.mm)
        return func(*args, **(kwargs or {}))


def test_the_solver_runs_124_products_where_the_plain_iteration_ran_210():
    gram, _, _ = spread_gram(16, 1e-6)
    with CountProducts() as count:
        upper = matrix_functions.largest_eigenvalue_bound(gram)
        matrix_functions.inverse_sqrt_newton_schulz(gram, upper, _NEWTON_SCHULZ_SCALES)
    # 3 a step (T, Y T, T Z), one per squaring of the lambda_max bound but the last
    assert count.products == 3 * 35 + matrix_functions._SQUARINGS - 1 == 124 < 3 * PLAIN_STEPS + 24
