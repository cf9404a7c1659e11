"""The conditioning modes (the lift each gives a singular value) and the values each option may take
(:class:`.options.ConditioningOptions` checks them)."""
from typing import Tuple

import torch

# Modes that bound kappa(X + C) <= target_kappa; 'graying' raises small singular values without a bound, and
# 'graying_dct' does so on the token grid's DCT frequencies instead of the singular vectors (:mod:`.dct_graying`).
BOUNDING_MODES = ('sigma_max', 'floor')
GRAYING_MODES = ('graying', 'graying_dct')
CONDITIONING_MODES = BOUNDING_MODES + GRAYING_MODES
# How the correction is computed (the option ``solver``): on the batched path (one masked program for the whole
# padded batch, :mod:`.batched`) with 'eigh' (one batched LAPACK/cuSOLVER eigh of the (B, d, d) stack) or
# 'newton_schulz' (matmuls only, no host sync; mode='sigma_max' only), or on the float64 reference (:mod:`.reference`,
# one image at a time, the tests' oracle) with 'reference_gram' (the Gram matrix and its canonical null-space
# completion) or 'reference_svd' (the thin SVD); 'auto' chooses (:meth:`.options.ConditioningOptions` documents how).
BATCHED_SOLVERS = ('eigh', 'newton_schulz')
REFERENCE_SOLVERS = ('reference_gram', 'reference_svd')
SOLVERS = ('auto', ) + BATCHED_SOLVERS + REFERENCE_SOLVERS
# The strength alpha scales C linearly (0: the identity, 1: the bound is reached). Beyond this the output is
# dominated by C (and can overflow half precision); 1e30 is a typo, not an experiment.
ALPHA_MAX = 100.0
# The token-scale controls (:mod:`.token_scale`); None is the method itself.
TOKEN_SCALE_CONTROLS = ('scale_matched', 'norm_matched')

# Singular values below RANK_RTOL * s_1 are treated as null directions on the Gram path. The eigenvalues
# of a float64 Gram matrix carry an absolute error of about eps * N * s_1^2, so singular values below
# ~1e-6 s_1 cannot be resolved from it; those directions are completed exactly instead. Leaving a true
# singular value s <= RANK_RTOL * s_1 in place moves the corrected spectrum by at most s (Weyl), so
# kappa(X + C) stays within (1 + RANK_RTOL) of the bound.
RANK_RTOL = 1e-5
# Token Graying's default strength (the authors' default).
GRAYING_EPSILON = 0.95
# When non-finite tokens (in or out) raise: True at once (a host read), False never, 'auto' at once on the CPU
# and, on CUDA, from a flag copied to the host without a sync and read at the next call (see .diagnostics).
CHECKS = ('auto', True, False)


def _lift(s: torch.Tensor, s1: torch.Tensor, options, s1_floor=0.0) -> torch.Tensor:
    """D = alpha * g(s): how much each singular value is raised (same shape as ``s``), for the mode, alpha (a float),
    target_kappa and epsilon of ``options`` (a :class:`.options.ConditioningOptions`); ``s1_floor``: see
    :func:`_grayed`."""
    alpha = options.alpha
    if options.mode == 'sigma_max':
        return (alpha / (options.target_kappa - 1)) * s1.expand_as(s)
    if options.mode == 'floor':
        return alpha * (s1 / options.target_kappa - s).clamp_min(0)
    return alpha * (_grayed(s, s1, options.epsilon, s1_floor) - s)


def graying_floor(dtype: torch.dtype) -> float:
    """The s_1 below which the graying map is scaled down with X, for tokens of ``dtype``: 1 / (RANK_RTOL max) for
    float32 and bfloat16 (2.9e-34), float16's smallest normal number (6.1e-5), 0 (never) for float64.

    The map does not scale with X, so its slope scales with 1 / s_1, times up to eps RANK_RTOL^(eps - 1) <=
    1 / RANK_RTOL near the rank threshold: computed in float64 and returned in the tokens' dtype, the gradient of a
    float32 matrix of subnormal values (s_1 ~ 1e-40) exceeded float32's range (Inf). Multiplying the map by
    min(1, s_1 / floor) keeps the slope within the dtype's range for upstream gradients of size 1; matrices with
    s_1 >= floor (every float32 token matrix of a real model) are mapped as before, smaller ones are shrunk with X,
    continuously down to the zero matrix, which maps to 0. float16's range (6.5e4) cannot hold that slope below
    s_1 = 1.5, an ordinary token scale, so there only matrices of subnormal values are shrunk (train graying with
    detach=False in bfloat16 or float32).
    """
    if dtype == torch.float64:
        return 0.0
    info = torch.finfo(dtype)
    return info.tiny if dtype == torch.float16 else 1 / (RANK_RTOL * info.max)


def _grayed(s: torch.Tensor, s1: torch.Tensor, epsilon: float, s1_floor=0.0) -> torch.Tensor:
    """Token Graying's singular values (s_i / s_1)^eps min(1, s_1 / s1_floor), with round-off-level s_i
    (<= RANK_RTOL s_1) -> 0; ``s1_floor`` (a number or a tensor broadcast against ``s1``; 0: no shrink) is
    :func:`graying_floor` of the tokens' dtype in the units of ``s``.

    The masked branches see only safe values, so that the gradient (detach=False) stays finite at s_i = 0
    and s_1 = 0.
    """
    live = s > RANK_RTOL * s1
    ratio = torch.where(live, s / torch.where(live, s1, torch.ones_like(s1)), torch.ones_like(s))
    grayed = torch.where(live, ratio**epsilon, torch.zeros_like(s))
    if isinstance(s1_floor, float) and s1_floor == 0:
        return grayed
    return grayed * torch.clamp_max(s1 / s1_floor, 1.0)


def _gram_scales(lam: torch.Tensor, options, s1_floor=0.0
                 ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """From the ascending eigenvalues ``lam`` of G = X^T X and the ``options`` (alpha a float): (s, null, lift, scale,
    keep); ``s1_floor``: see :func:`_grayed`.

    ``null`` marks the null directions to complete (each lifted by ``lift``), ``scale`` the factor C adds
    to X v_i on the others and ``keep`` = 1 + scale, the factor of X + C (X + C = X V diag(keep) V^T there).
    Zero samples (s_1 = 0) get nothing.
    """
    s = lam.clamp_min(0).sqrt()
    s1 = s[..., -1:]
    has_signal = s1 > 0
    null = (s <= RANK_RTOL * s1) & has_signal  # a prefix of the ascending order, per sample
    lift = _lift(s, s1, options, s1_floor) * has_signal
    # Non-null directions: X v_i scaled by (s_i + D_i) / s_i, i.e. X v_i (D_i / s_i) added.
    scale = torch.where(null | ~has_signal, torch.zeros_like(s), lift / s.clamp_min(1e-300))
    keep = scale + 1
    if options.mode == 'graying':
        alpha = options.alpha
        # keep = (1 - alpha) + alpha g_i / s_i, formed directly: 1 + (g_i / s_i - 1) would cancel to 0 where
        # s_i >> 1 (graying's output does not scale with X). Null directions have g_i = 0: X's own (round-off)
        # component there is scaled by 1 - alpha, as on the SVD path, and nothing is lifted or completed.
        keep = (1 - alpha) + alpha * _grayed(s, s1, options.epsilon, s1_floor) / s.clamp_min(1e-300)
        scale = keep - 1
        null = torch.zeros_like(null)
    return s, null, lift, scale, keep

