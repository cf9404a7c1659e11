"""What rounding to a low-precision dtype allows the conditioner's output: the float64 bound widened by the
roundings, for the float16/bfloat16 tests on the CPU and on a GPU."""
import torch

from condtok_mm.conditioning import condition_number, condition_tokens, token_correction


def rounding_budget(value, dtype):
    """An upper bound, per matrix, on ||fl(V) - V||_2 when each entry of the float64 matrices V is rounded to
    ``dtype`` (round to nearest): an entry moves by at most u |v| (u = eps / 2, the unit roundoff) where ``dtype``
    represents it as a normal number and by at most u * tiny (half the subnormal spacing) below, so
    ||fl(V) - V||_2 <= ||fl(V) - V||_F <= u (||V||_F + tiny sqrt(#entries))."""
    info = torch.finfo(dtype)
    unit_roundoff = info.eps / 2
    entries = value.shape[-2] * value.shape[-1]
    return unit_roundoff * (torch.linalg.matrix_norm(value) + info.tiny * entries**0.5)


def low_precision_check(x, y, mode, solver='reference_gram'):
    """What the rounding to x.dtype allows for the output ``y`` of condition_tokens(x) in that dtype.

    The correction C is computed in float64 from X (exact in float64), cast to the dtype and added in the dtype:
    y = fl(X + fl(C)), two roundings, so y is within E = budget(C) + budget(X + fl(C)) of the exact X + C in
    spectral norm, and Weyl's inequality bounds kappa(y) <= (s_max + E) / (s_min - E) with s_max, s_min of the
    exact X + C. Returns (||y - (X + C)||_2, E, kappa(y), that bound), one value per matrix. ``solver`` takes X + C
    from the float64 reference ('reference_gram') or from the batched path with Newton-Schulz ('newton_schulz', the
    CUDA default, run in float64 on the CPU).
    """
    x64 = x.double()
    correction = token_correction(x64, mode=mode) if solver == 'reference_gram' else \
        condition_tokens(x64, mode=mode, solver='newton_schulz') - x64
    exact = x64 + correction
    budget = (rounding_budget(correction, x.dtype)
              + rounding_budget(x64 + correction.to(x.dtype).double(), x.dtype))
    s = torch.linalg.svdvals(exact)
    error = torch.linalg.matrix_norm(y.double() - exact, ord=2)
    return error, budget, condition_number(y), (s[:, 0] + budget) / (s[:, -1] - budget)
