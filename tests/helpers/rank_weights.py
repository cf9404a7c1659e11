"""A hook for the multi-process tests, imported by the training processes through a config's custom_imports
(with tests/helpers on PYTHONPATH): only rank 0 writes checkpoints, so this is how a test sees every rank's
weights."""
import os.path as osp

import torch
from mmengine.dist import get_rank
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper
from mmengine.registry import HOOKS


@HOOKS.register_module()
class SaveRankWeights(Hook):
    """Writes this rank's model state dict to ``<work_dir>/rank<rank>_weights.pth`` when training ends."""

    def after_train(self, runner) -> None:
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        torch.save(model.state_dict(), osp.join(runner.work_dir, f'rank{get_rank()}_weights.pth'))
