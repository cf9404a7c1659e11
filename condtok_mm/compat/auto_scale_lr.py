"""``--auto-scale-lr`` also scales the ``base_lr`` that the log reports (mends mmengine/runner/runner.py).

mmengine 0.10.7 ``Runner.scale_lr`` (runner/runner.py L928-985) scales ``optimizer.param_groups`` but not
``OptimWrapper.base_param_settings``, the extra group through which the param schedulers and the logger track
``base_lr``; with ``--auto-scale-lr`` the log then shows the unscaled base_lr next to the scaled lr.
"""
from mmengine.optim import OptimWrapperDict
from mmengine.runner import Runner

_upstream_scale_lr = Runner.scale_lr


def _scale_lr(self, optim_wrapper, auto_scale_lr=None) -> None:
    """``Runner.scale_lr`` that also scales the learning rate the log reports as ``base_lr``."""
    wrappers = (list(optim_wrapper.values())
                if isinstance(optim_wrapper, OptimWrapperDict) else [optim_wrapper])
    config_lrs = [wrapper.optimizer.param_groups[0]['lr'] for wrapper in wrappers]
    _upstream_scale_lr(self, optim_wrapper, auto_scale_lr)
    for wrapper, config_lr in zip(wrappers, config_lrs):
        if wrapper.base_param_settings is not None and config_lr > 0:
            wrapper.base_param_settings['lr'] *= wrapper.optimizer.param_groups[0]['lr'] / config_lr


def apply() -> None:
    Runner.scale_lr = _scale_lr
