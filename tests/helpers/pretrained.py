"""Classifiers of the demo classification configs saved as their pretraining runs would save them, for the tests
of the bridge from mmpretrain's checkpoints to mmdet's detectors."""
import os.path as osp

import torch
from mmengine.config import Config
from mmengine.registry import DefaultScope
from mmengine.runner.checkpoint import save_checkpoint

from helpers.repo import REPO_ROOT

DEMO = osp.join(REPO_ROOT, 'configs', 'demo')


def build(cfg_model, scope):
    import mmdet.models  # noqa: F401  (registration)
    import mmpretrain.models  # noqa: F401
    from mmdet.registry import MODELS as DET_MODELS
    from mmpretrain.registry import MODELS as PRETRAIN_MODELS
    registry = {'mmpretrain': PRETRAIN_MODELS, 'mmdet': DET_MODELS}[scope]
    with DefaultScope.overwrite_default_scope(scope):  # as the Runner of each config sets it
        return registry.build(cfg_model)


def saved_classifier(cfg, path, epoch):
    """The classifier of the classification config ``cfg`` with every weight made distinct from any
    initialisation, saved at ``path`` as mmengine's CheckpointHook saves one; returns its state dict."""
    cfg.model.data_preprocessor = cfg.data_preprocessor
    classifier = build(cfg.model, 'mmpretrain')
    with torch.no_grad():
        for tensor in classifier.state_dict().values():
            if tensor.is_floating_point():
                tensor.add_(torch.randn_like(tensor))
    state = classifier.state_dict()
    save_checkpoint(dict(meta=dict(epoch=epoch), state_dict=state), path)
    return state


def pretrained_classifier(classification_config, path):
    """:func:`saved_classifier` of a demo classification config, seeded, as its 20-epoch run would save it."""
    torch.manual_seed(0)
    return saved_classifier(Config.fromfile(osp.join(DEMO, classification_config)), path, epoch=20)
