"""ConditioningOptions: every option of the correction in one object, checked once when it is made.

The functional API (:mod:`.functional`), the float64 reference's public functions and
:class:`~condtok_mm.models.TokenConditioner` all take it, and the math below them takes it whole, so an option is
declared, documented and checked here only, and every invalid value is refused in one wording:
``'<where>: <name>=<value> is invalid; use <what is valid>'``. An option name that has been replaced is refused
naming the one to use (:data:`RENAMED`).
"""
import dataclasses
import math
from typing import Optional, Union

import torch

from .diagnostics import BAD_ALPHA
from .modes import (ALPHA_MAX, BATCHED_SOLVERS, CHECKS, CONDITIONING_MODES, GRAYING_EPSILON, REFERENCE_SOLVERS,
                    SOLVERS, TOKEN_SCALE_CONTROLS)

# what a valid alpha is, in every refusal of one
_ALPHA_RANGE = f'a number in [0, {ALPHA_MAX:g}] (1 reaches the bound, 0 disables the correction)'
# Option names that were replaced, and the solver each value of the old one is now.
RENAMED = dict(method=dict(batched="'auto' (or 'eigh', 'newton_schulz')", gram="'reference_gram'",
                           svd="'reference_svd'"))


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _one_of(values) -> str:
    return 'one of ' + ', '.join(repr(value) for value in values)


def renamed_refusal(where: str, name: str, value=None) -> TypeError:
    """The error for the replaced option ``name`` (given ``value``, or None where it is read), naming the option to
    use instead."""
    given = f'{name}={value!r}' if value is not None else name
    use = RENAMED[name].get(value, _one_of(SOLVERS)) if value is not None else _one_of(SOLVERS)
    return TypeError(f'{where}: {given} is no longer an option; use solver={use}: one option, solver, says how the '
                     'correction is computed, as mode says which correction it is')


@dataclasses.dataclass(frozen=True)
class ConditioningOptions:
    """The options of the correction C (see :mod:`condtok_mm.conditioning` for the math).

    Two words say what is computed and how: ``mode`` which correction X + C is, ``solver`` how it is computed (the
    batched path with one eigensolver or another, or a float64 reference). They are separate because they are
    separate choices: every mode but 'graying_dct' runs on every path, and one config key per choice is what an
    mmdet config sets; the implementation is one option, not two (a path and a solver within it), so that no
    pair of values can contradict each other.

    Args:
        mode (str): 'sigma_max' (C = s_1/(t-1) U V^T, the paper's construction), 'floor' (lift only the singular
            values below s_1/t to s_1/t) or 'graying' (X + C = U (S/s_1)^epsilon V^T, Token Graying, arXiv
            2505.01996; no bound, target_kappa unused) or 'graying_dct' (Token Graying's DCT form: the same map with
            the token grid's 2-D DCT-II frequencies for U and their norms for S, :mod:`.dct_graying`; token grids
            (B, H, W, d) and whole images only, the batched path, detach=True). Default: 'sigma_max'.
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
            SVD on the float64 reference (solver 'auto' runs 'reference_gram'), which then also runs where no
            gradient is wanted (evaluation), so that a model evaluates the function it was trained with; (nearly)
            null or repeated singular directions contribute no gradient instead of an infinite one. Default: True.
        solver (str): how the correction is computed. The batched path (one masked program for the whole padded
            batch, :mod:`.batched`): 'eigh' or 'newton_schulz' ('sigma_max' only; matmuls, no host sync). The
            float64 reference (:mod:`.reference`, one image at a time, the tests' oracle): 'reference_gram' (the
            Gram matrix with its canonical null-space completion) or 'reference_svd' (the thin SVD, LAPACK's
            completion). 'auto': 'reference_gram' with detach=False, else Newton-Schulz for 'sigma_max' on CUDA and
            eigh otherwise (chosen from measurements on torch 2.11, before its faster batched CUDA eigh:
            :func:`.batched.resolve_solver`). Default: 'auto'.
        centred (bool): condition X on the complement of the all-ones channel vector only, which is what the
            next LayerNorm lets through: kappa(X Q + C Q) <= target_kappa and C 1 = 0. Default: False (the
            paper's construction).
        epsilon (float): Token Graying's exponent, 0 < epsilon <= 1 ('graying' and 'graying_dct' only; smaller is
            stronger, 1 only rescales s_1 to 1). Default: 0.95 (the authors' default).
        check (bool or str): when non-finite tokens (in, or out of float16's range) and a tensor alpha out of
            its range raise on the batched path: True at once, False never, 'auto' at once on the CPU and
            deferred to a later call on CUDA (no host sync; :mod:`.diagnostics`). Not False where the reference
            runs, which reads every value on the host and cannot run on non-finite tokens. Default: 'auto'.
        control (str, optional): a token-scale control for studies that separate conditioning from the token
            scale it brings (:mod:`.token_scale`; r = ||X + C||_F / ||X||_F per image, over its valid tokens,
            constant in backward). 'scale_matched': the output is r X (the conditioned model's token scale, X's
            kappa). 'norm_matched': (X + C) / r (kappa <= target_kappa at X's scale). None: X + C, the method
            itself. Default: None.
        where (str): the name errors start with, e.g. 'CondSwinTransformer stage 0'. Not an option of the
            math: two option sets that differ only here compare equal. Default: 'condition_tokens'.

    Raises:
        ValueError: naming the option, the value and what is valid, for an invalid value or combination.
        TypeError: naming the option to use, for a replaced option name (:data:`RENAMED`).
    """

    mode: str = 'sigma_max'
    alpha: Union[float, torch.Tensor] = 1.0
    target_kappa: float = 2.0
    detach: bool = True
    solver: str = 'auto'
    centred: bool = False
    epsilon: float = GRAYING_EPSILON
    check: Union[bool, str] = 'auto'
    control: Optional[str] = None
    where: str = dataclasses.field(default='condition_tokens', compare=False)

    def __new__(cls, *args, **kwargs):
        # before the generated __init__, which would refuse a replaced name without saying what replaced it
        for name in RENAMED:
            if name in kwargs:
                raise renamed_refusal(kwargs.get('where', 'condition_tokens'), name, kwargs[name])
        return super().__new__(cls)

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
        if not (_is_number(self.epsilon) and 0 < self.epsilon <= 1):
            self._refuse('epsilon', f"a number in (0, 1] (mode='graying': kappa -> kappa^epsilon; the authors' "
                         f'default is {GRAYING_EPSILON})')
        object.__setattr__(self, 'epsilon', float(self.epsilon))
        if self.solver not in SOLVERS:
            self._refuse('solver', _one_of(SOLVERS))
        if self.solver == 'newton_schulz' and self.mode != 'sigma_max':
            self._refuse('solver', f"'auto' or 'eigh' with mode={self.mode!r}: Newton-Schulz computes "
                         "mode='sigma_max' only (floor and graying need the eigenvalues themselves)")
        if self.mode == 'graying_dct' and self.solver in REFERENCE_SOLVERS:
            self._refuse('solver', "'auto' with mode='graying_dct' (the DCT form has no SVD to refer to; its "
                         'float64 oracle is scipy.fft.dctn in the tests)')
        if self.mode == 'graying_dct' and not self.detach:
            self._refuse('detach', "True with mode='graying_dct' (its correction is a constant in backward)")
        if not self.detach and self.solver in BATCHED_SOLVERS:
            self._refuse('solver', "'auto', 'reference_gram' or 'reference_svd' with detach=False: the gradient "
                         "through the SVD runs on the float64 reference ('auto': 'reference_gram')")
        if not (self.check == 'auto' or self.check is True or self.check is False):
            self._refuse('check', f"{_one_of(CHECKS)} ('auto': at once on the CPU, deferred to the next call on "
                         'CUDA)')
        if self.on_reference_path and self.check is False:
            runs = (f'solver={self.solver!r}' if self.solver != 'auto'
                    else "detach=False (the gradient through the SVD runs on the float64 reference)")
            self._refuse_unchecked(runs)
        if self.control is not None and self.control not in TOKEN_SCALE_CONTROLS:
            self._refuse('control', f'None (the method) or {_one_of(TOKEN_SCALE_CONTROLS)}')
        if not isinstance(self.where, str):
            self._refuse('where', 'a name for error messages, e.g. the module that conditions')

    def _refuse(self, name: str, valid: str):
        raise self._refusal(name, valid)

    def _refuse_unchecked(self, runs: str):
        """Refuse check=False where the reference runs (``runs`` says why it does)."""
        self._refuse('check', f"True or 'auto' with {runs}: the reference reads every value on the host and cannot "
                     'run on non-finite tokens, so it always raises at once')

    def _refusal(self, name: str, valid: str) -> ValueError:
        return ValueError(f'{self.where}: {name}={getattr(self, name)!r} is invalid; use {valid}')

    @property
    def on_reference_path(self) -> bool:
        """Whether the float64 reference runs: solver 'reference_gram'/'reference_svd', and detach=False (the
        gradient through the SVD) whether or not a gradient is wanted at a call, so that a model evaluates the
        function it trained (the batched path completes the null directions differently)."""
        return self.solver in REFERENCE_SOLVERS or not self.detach

    def for_reference(self, applies_control: bool = True) -> 'ConditioningOptions':
        """These options as the float64 reference takes them: alpha read as a float (a tensor alpha's value now,
        refused outside its range). Refused: a batched solver ('eigh', 'newton_schulz'; the reference computes its
        own decomposition), check=False (it reads every value), and a control where the caller does not apply one
        (``applies_control=False``: :func:`.reference.token_correction` and :func:`.reference.write_conditioned`)."""
        if self.solver in BATCHED_SOLVERS:
            self._refuse('solver', f"'auto' or {_one_of(REFERENCE_SOLVERS)} for the float64 reference (it computes "
                         'its own decomposition)')
        if self.check is False:
            self._refuse_unchecked(f'{self.where} (the float64 reference)')
        if self.control is not None and not applies_control:
            self._refuse('control', f'None with {self.where} (it computes X + C or C; condition_tokens and the '
                         'other functions of condtok_mm.conditioning apply the control)')
        return self.replace(alpha=self.alpha_value()) if isinstance(self.alpha, torch.Tensor) else self

    def check_window(self, window_size, shift_size) -> None:
        """Raise ValueError, in the options' wording, unless ``window_size`` >= 1 and 0 <= ``shift_size`` < it and
        the mode conditions attention windows (the DCT form transforms whole token grids)."""
        where = self.where
        if not (isinstance(window_size, int) and not isinstance(window_size, bool) and window_size >= 1):
            raise ValueError(f'{where}: window_size={window_size!r} is invalid; use an integer >= 1 (the side of the '
                             'attention window)')
        if not (isinstance(shift_size, int) and not isinstance(shift_size, bool) and 0 <= shift_size < window_size):
            raise ValueError(f'{where}: shift_size={shift_size!r} is invalid; use an integer in '
                             f'[0, window_size={window_size})')
        if self.mode == 'graying_dct':
            raise ValueError(f"{where}: mode='graying_dct' is invalid per attention window (the DCT form transforms "
                             "each image's whole token grid); use scope='image', or mode='graying' per window")

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
        """The option names, ``where`` included (a constant, so that a compiled forward reads it)."""
        return OPTION_NAMES

    def replace(self, **changes) -> 'ConditioningOptions':
        """A copy with ``changes``, checked again as a whole (a new mode may not suit the solver)."""
        for name in RENAMED:
            if name in changes:
                raise renamed_refusal(self.where, name, changes[name])
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


OPTION_NAMES = tuple(field.name for field in dataclasses.fields(ConditioningOptions))
