"""Ramp the conditioning in when fine-tuning a backbone that was pretrained without it (protocol P1-ramp)."""
import math
from typing import Dict, Optional

from mmengine.hooks import Hook

from condtok_mm.models.token_conditioner import TokenConditioner
from condtok_mm.registry import HOOKS

RAMP_SHAPES = ('linear', 'cosine')
# Message-hub key; mmengine's LogProcessor drops the 'train/' prefix, so the text log and vis_data/scalars.json
# show it as 'condtok/strength'.
STRENGTH_KEY = 'train/condtok/strength'


def ramp_strength(step: float, length: float, shape: str = 'linear') -> float:
    """The ramp's strength after ``step`` of ``length`` steps: s(t), t = min(step / length, 1).

        linear: s = t;    cosine: s = (1 - cos(pi t)) / 2

    Both are 0 at step 0 and 1 from step ``length`` on; the cosine starts and ends with zero slope.
    """
    t = min(max(step / length, 0.0), 1.0)
    if shape == 'linear':
        return t
    if shape == 'cosine':
        return 0.5 * (1.0 - math.cos(math.pi * t))
    raise ValueError(f'ramp_strength: shape={shape!r} is not supported; use one of {", ".join(RAMP_SHAPES)}')


@HOOKS.register_module()
class ConditioningStrengthRampHook(Hook):
    """Ramp the strength of the conditioning from 0 to 1 over the first iterations of training.

    Before each training iteration ``i`` (mmengine's ``runner.iter``, 0-based) every
    :class:`~condtok_mm.models.TokenConditioner` of the model gets ``alpha = s(i) * alpha_0``, where
    ``alpha_0`` is the alpha its config gives (1.0 in our configs: the full correction C) and s the ramp of
    :func:`ramp_strength`: s(0) = 0, the pretrained backbone sees its own tokens, and s = 1 from iteration
    ``length`` on. alpha scales C, so the tokens move from X to X + C (with ``control='norm_matched'``, to
    (X + C) / r) continuously instead of in one step at iteration 0.

    The strength is a function of ``runner.iter`` alone, so ``--resume`` continues the ramp exactly where
    the interrupted run was. It is written to the message hub as ``train/condtok/strength`` (shown in the
    text log and ``vis_data/scalars.json`` as ``condtok/strength``).

    Validation and testing always see the full method: before every validation and test run each
    conditioner is set to its ``alpha_0`` (strength 1), whatever the point of the ramp; the next training
    iteration sets the ramp's value again.

    Args:
        length (int): the ramp's length, in iterations, or in epochs with ``by_epoch=True``; >= 1.
        shape (str): 'linear' or 'cosine' (see :func:`ramp_strength`). Default: 'linear'.
        by_epoch (bool): count ``length`` in epochs. It is converted to ``length * len(train_dataloader)``
            iterations (as mmengine's ``convert_to_iter_based`` schedulers do), so the strength still rises
            every iteration. Default: False.
    """

    priority = 'NORMAL'

    def __init__(self, length: int, shape: str = 'linear', by_epoch: bool = False):
        if isinstance(length, bool) or not isinstance(length, int) or length < 1:
            raise ValueError(f'ConditioningStrengthRampHook: length={length!r} is invalid; use an int >= 1 '
                             '(iterations, or epochs with by_epoch=True)')
        if shape not in RAMP_SHAPES:
            raise ValueError(f'ConditioningStrengthRampHook: shape={shape!r} is not supported; use one of '
                             f'{", ".join(RAMP_SHAPES)}')
        if not isinstance(by_epoch, bool):
            raise ValueError(f'ConditioningStrengthRampHook: by_epoch={by_epoch!r} is invalid; use True or False')
        self.length = length
        self.shape = shape
        self.by_epoch = by_epoch
        self._full_alpha: Dict[TokenConditioner, float] = {}
        self._length_iters: Optional[int] = None

    def before_train(self, runner) -> None:
        self._find_conditioners(runner)
        self._length_iters = self.length * len(runner.train_dataloader) if self.by_epoch else self.length

    def strength(self, iteration: int) -> float:
        """The strength before training iteration ``iteration`` (0-based)."""
        return ramp_strength(iteration, self._length_iters, self.shape)

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        strength = self.strength(runner.iter)
        self._set(strength)
        runner.message_hub.update_scalar(STRENGTH_KEY, strength)

    def before_val(self, runner) -> None:
        self._set_full(runner)

    def before_test(self, runner) -> None:
        self._set_full(runner)

    def _set_full(self, runner) -> None:
        if not self._full_alpha:  # runner.val() or runner.test() without training
            self._find_conditioners(runner)
        self._set(1.0)

    def _set(self, strength: float) -> None:
        for conditioner, alpha in self._full_alpha.items():
            conditioner.alpha = strength * alpha

    def _find_conditioners(self, runner) -> None:
        # runner.model.modules() also walks the module inside a DDP wrapper
        conditioners = [m for m in runner.model.modules() if isinstance(m, TokenConditioner)]
        if not conditioners:
            raise ValueError(f'ConditioningStrengthRampHook: {type(runner.model).__name__} has no TokenConditioner '
                             'to ramp; the hook is for conditioned models (the -condtok configs): remove it from '
                             'custom_hooks or use a conditioned config')
        self._full_alpha = {conditioner: conditioner.alpha for conditioner in conditioners}
