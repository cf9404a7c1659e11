"""ConditioningOptions: every option of the correction in one object, checked once when it is made.

The functional API (:mod:`.functional`) and :class:`~condtok_mm.models.TokenConditioner` both take it, so an
option is declared, documented and checked here only, and every invalid value is refused in one wording:
``'<where>: <name>=<value> is invalid; use <what is valid>'``.
"""
import dataclasses
import math
from typing import Union

import torch

from .diagnostics import BAD_ALPHA
from .modes import ALPHA_MAX, CHECKS, CONDITIONING_METHODS, CONDITIONING_MODES, GRAYING_EPSILON, SOLVERS

# what a valid alpha is, in every refusal of one
_ALPHA_RANGE = f'a number in [0, {ALPHA_MAX:g}] (1 reaches the bound, 0 disables the correction)'


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _one_of(values) -> str:
    return 'one of ' + ', '.join(repr(value) for value in values)


@dataclasses.dataclass(frozen=True)
class ConditioningOptions:
    """The options of the correction C (see :mod:`condtok_mm.conditioning` for the math).

    Args:
        mode (str): 'sigma_max' (C = s_1/(t-1) U V^T, the paper's construction), 'floor' (lift only the singular
            values below s_1/t to s_1/t) or 'graying' (X + C = U (S/s_1)^epsilon V^T, Token Graying, arXiv
            2505.01996; no bound, target_kappa unused) or 'graying_dct' (Token Graying's DCT form: the same map with
            the token grid's 2-D DCT-II frequencies for U and their norms for S, :mod:`.dct_graying`; token grids
            (B, H, W, d) and whole images only, method='batched', detach=True). Default: 'sigma_max'.
        alpha (float or Tensor): scale of the correction, in [0, ALPHA_MAX = 100]; 1 reaches the bound, 0 is the
            identity. A 0-dim floating CPU tensor is used as it is (a schedule that updates it in place changes
            the strength of a compiled or captured program without recompiling): its value is checked when the
            options are made (a read of host memory, no device sync), and at every call without a read: the
            batched path flags a value outside the range (NaN included) in its status, reported as ``check``
            says (at once on the CPU, at a later call on CUDA), the reference reads it anyway. Default: 1.0.
        target_kappa (float): the bound t on kappa, finite and > 1 ('sigma_max', 'floor'). Default: 2.0 (the
            paper's value).
        detach (bool): treat C as a constant in backward, so the gradient w.r.t. the tokens is the identity (the
            paper is silent; the cheaper, always well-defined choice). With False the gradient flows through the
            SVD on the float64 reference path (method='gram' where method='batched'), which then also runs where
            no gradient is wanted (evaluation), so that a model evaluates the function it was trained with;
            (nearly) null or repeated singular directions contribute no gradient instead of an infinite one.
            Default: True.
        method (str): 'batched' (one masked program for the whole padded batch, :mod:`.batched`), 'gram' or 'svd'
            (the float64 reference, one image at a time, :mod:`.reference`). Default: 'batched'.
        centred (bool): condition X on the complement of the all-ones channel vector only, which is what the
            next LayerNorm lets through: kappa(X Q + C Q) <= target_kappa and C 1 = 0. Default: False (the
            paper's construction).
        epsilon (float): Token Graying's exponent, 0 < epsilon <= 1 ('graying' and 'graying_dct' only; smaller is
            stronger, 1 only rescales s_1 to 1). Default: 0.95 (the authors' default).
        solver (str): the batched path's spectral solver: 'eigh', 'newton_schulz' ('sigma_max' only; matmuls, no
            host sync) or 'auto' (Newton-Schulz for 'sigma_max' on CUDA, eigh otherwise; chosen from measurements on
            torch 2.11, before its faster batched CUDA eigh: :func:`.batched.resolve_solver`); only 'auto' where
            the reference runs (method 'gram'/'svd', detach=False), which has no choice of solver. Default: 'auto'.
        check (bool or str): when non-finite tokens (in, or out of float16's range) and a tensor alpha out of
            its range raise on the batched path: True at once, False never, 'auto' at once on the CPU and
            deferred to a later call on CUDA (no host sync; :mod:`.diagnostics`). Not False where the reference
            runs, which reads every value on the host and cannot run on non-finite tokens. Default: 'auto'.
        where (str): the name errors start with, e.g. 'CondSwinTransformer stage 0'. Not an option of the
            math: two option sets that differ only here compare equal. Default: 'condition_tokens'.

    Raises:
        ValueError: naming the option, the value and what is valid, for an invalid value or combination.
    """

    mode: str = 'sigma_max'
    alpha: Union[float, torch.Tensor] = 1.0
    target_kappa: float = 2.0
    detach: bool = True
    method: str = 'batched'
    centred: bool = False
    epsilon: float = GRAYING_EPSILON
    solver: str = 'auto'
    check: Union[bool, str] = 'auto'
    where: str = dataclasses.field(default='condition_tokens', compare=False)

    def __post_init__(self):
        if self.mode not in CONDITIONING_MODES:
            self._refuse('mode', _one_of(CONDITIONING_MODES))
        if isinstance(self.alpha, torch.Tensor):  # a strength a schedule updates in place: kept, not copied
            if self.alpha.dim() != 0 or not self.alpha.is_floating_point() or self.alpha.device.type != 'cpu':
                self._refuse('alpha', f'a number in [0, {ALPHA_MAX:g}] or a 0-dim floating CPU tensor (got '
                             f'{self.alpha.dtype} of shape {tuple(self.alpha.shape)} on {self.alpha.device})')
            self.alpha_value()  # its value now; later ones are checked per call (flag_invalid_alpha)
        elif _is_number(self.alpha) and 0 <= self.alpha <= ALPHA_MAX:
            object.__setattr__(self, 'alpha', float(self.alpha))
        else:
            self._refuse('alpha', _ALPHA_RANGE)
        if not (_is_number(self.target_kappa) and math.isfinite(self.target_kappa) and self.target_kappa > 1):
            self._refuse('target_kappa', 'a finite number > 1 (the paper uses 2.0)')
        object.__setattr__(self, 'target_kappa', float(self.target_kappa))
        for flag in ('detach', 'centred'):
            if not isinstance(getattr(self, flag), bool):
                self._refuse(flag, 'True or False')
        if self.method not in CONDITIONING_METHODS:
            self._refuse('method', _one_of(CONDITIONING_METHODS))
        if not (_is_number(self.epsilon) and 0 < self.epsilon <= 1):
            self._refuse('epsilon', f"a number in (0, 1] (mode='graying': kappa -> kappa^epsilon; the authors' "
                         f'default is {GRAYING_EPSILON})')
        object.__setattr__(self, 'epsilon', float(self.epsilon))
        if self.solver not in SOLVERS:
            self._refuse('solver', _one_of(SOLVERS))
        if self.solver == 'newton_schulz' and self.mode != 'sigma_max':
            self._refuse('solver', f"'auto' or 'eigh' with mode={self.mode!r}: Newton-Schulz computes "
                         "mode='sigma_max' only (floor and graying need the eigenvalues themselves)")
        if self.mode == 'graying_dct' and self.method != 'batched':
            self._refuse('method', "'batched' with mode='graying_dct' (the DCT form has no SVD to refer to; its "
                         'float64 oracle is scipy.fft.dctn in the tests)')
        if self.mode == 'graying_dct' and not self.detach:
            self._refuse('detach', "True with mode='graying_dct' (its correction is a constant in backward)")
        if not (self.check == 'auto' or self.check is True or self.check is False):
            self._refuse('check', f"{_one_of(CHECKS)} ('auto': at once on the CPU, deferred to the next call on "
                         'CUDA)')
        if self.on_reference_path:
            runs = (f'method={self.method!r}' if self.method != 'batched'
                    else "detach=False (the gradient through the SVD runs on the float64 reference, method='gram')")
            if self.solver != 'auto':
                self._refuse('solver', f"'auto' with {runs}: the reference computes its own eigendecomposition "
                             "(solver chooses the batched path's)")
            if self.check is False:
                self._refuse('check', f"True or 'auto' with {runs}: the reference reads every value on the host "
                             'and cannot run on non-finite tokens, so it always raises at once')
        if not isinstance(self.where, str):
            self._refuse('where', 'a name for error messages, e.g. the module that conditions')

    def _refuse(self, name: str, valid: str):
        raise self._refusal(name, valid)

    def _refusal(self, name: str, valid: str) -> ValueError:
        return ValueError(f'{self.where}: {name}={getattr(self, name)!r} is invalid; use {valid}')

    @property
    def on_reference_path(self) -> bool:
        """Whether the float64 reference runs: method='gram'/'svd', and detach=False (the gradient through the SVD)
        whether or not a gradient is wanted at a call, so that a model evaluates the function it trained (the
        batched path completes the null directions differently)."""
        return self.method != 'batched' or not self.detach

    def alpha_value(self) -> float:
        """alpha's value now, as a float (a tensor alpha is read: host memory, no device sync); refused outside
        [0, ALPHA_MAX] or NaN."""
        value = float(self.alpha)
        if not 0 <= value <= ALPHA_MAX:
            raise self.alpha_refusal()
        return value

    def alpha_refusal(self) -> ValueError:
        """The error for an alpha outside its range (a tensor alpha shows its value now)."""
        return self._refusal('alpha', _ALPHA_RANGE)

    def flag_invalid_alpha(self, status: torch.Tensor) -> torch.Tensor:
        """The batched path's statuses ``status`` (S,), with BAD_ALPHA (the largest code) everywhere if a tensor
        alpha's value at this call is outside [0, ALPHA_MAX] or NaN: tensor ops on the 0-dim CPU tensor, no read,
        so that a value a schedule wrote after the options were made is caught as non-finite tokens are."""
        if not isinstance(self.alpha, torch.Tensor):
            return status
        invalid = ~((self.alpha >= 0) & (self.alpha <= ALPHA_MAX))
        return torch.maximum(status, invalid.to(status.dtype) * BAD_ALPHA)

    @classmethod
    def names(cls) -> tuple:
        """The option names, ``where`` included."""
        return tuple(field.name for field in dataclasses.fields(cls))

    def replace(self, **changes) -> 'ConditioningOptions':
        """A copy with ``changes``, checked again as a whole (a new mode may not suit the solver)."""
        unknown = sorted(set(changes) - set(self.names()))
        if unknown:
            raise TypeError(f'{self.where}: unknown conditioning option(s) {unknown}; the options are '
                            f'{", ".join(self.names())}')
        return dataclasses.replace(self, **changes)

    @classmethod
    def resolve(cls, options, where: str, changes: dict) -> 'ConditioningOptions':
        """``options`` (a ConditioningOptions, or None for the defaults named ``where``) with the keyword options
        ``changes``: what the functional API does with its arguments."""
        if options is None:
            options = cls(where=where)
        elif not isinstance(options, cls):
            raise TypeError(f'{where}: options must be a ConditioningOptions (or None, with keyword options such '
                            f"as mode='floor'), got {type(options).__name__}")
        return options.replace(**changes) if changes else options
