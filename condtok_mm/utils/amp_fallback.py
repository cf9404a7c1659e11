"""A config that asks for mixed precision trains in float32 where no GPU can run it."""
import logging

import torch
from mmengine.config import Config
from mmengine.logging import print_log


def fall_back_from_amp_on_cpu(cfg: Config) -> None:
    """Switch AmpOptimWrapper to OptimWrapper when no GPU is present, with a warning.

    mmengine's AmpOptimWrapper asserts a CUDA/NPU/MLU/MUSA device, so a config that enables AMP (ViTDet's,
    or ``--amp``) would otherwise not run on a CPU at all. Mixed precision is a GPU speed optimization;
    training in float32 computes the same model.
    """
    optim_wrapper = cfg.get('optim_wrapper')
    if optim_wrapper is None or optim_wrapper.get('type') != 'AmpOptimWrapper':
        return
    if torch.cuda.is_available():
        return
    print_log('AMP needs a GPU and none is available: training in float32 with OptimWrapper instead.',
              logger='current', level=logging.WARNING)
    optim_wrapper.type = 'OptimWrapper'
    for amp_only_key in ('loss_scale', 'dtype', 'use_fsdp'):
        optim_wrapper.pop(amp_only_key, None)
