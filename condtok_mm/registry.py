"""Registries condtok_mm registers into.

We register into MMEngine's root registries rather than into mmdet's or mmpretrain's: every mm* project's
registry (mmdet, mmpretrain, mmseg, ...) is a child of the root, and a child looks a bare type name up in
its parent when it does not hold it itself. One registration therefore makes ``type='CondSwinTransformer'``
(or ``TokenConditioner``, ``AttentionKappaHook``, ...) build from mmdet *and* mmpretrain configs,
without registering the same class twice or naming a scope.
"""
from mmengine.registry import HOOKS, METRICS, MODELS, OPTIM_WRAPPER_CONSTRUCTORS  # noqa: F401
