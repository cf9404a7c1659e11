"""SpectralAttentionBackbone: spectral conditioning of attention (W_Q, W_K, W_V + lambda I) for any backbone."""
import math
from typing import Optional, Sequence

import torch
import torch.nn as nn

from condtok_mm.models.layout import attention_projections
from condtok_mm.models.wrappers import TransparentWrapper
from condtok_mm.registry import MODELS
from condtok_mm.spectral import add_scaled_identity


@MODELS.register_module()
class SpectralAttentionBackbone(TransparentWrapper):
    """Any backbone whose attention layers use W + lambda I for their query, key and value projections.

    Spectral conditioning of attention (arXiv 2603.07162, see :mod:`condtok_mm.spectral`): a forward hook on
    each projection Linear adds lambda x to its output (lambda [x; x; x] for a fused ``qkv``, one lambda I
    per block and so per head). Nothing is stored: the model has no new parameters or buffers, its state dict
    has exactly the wrapped backbone's keys and raw weights, and a checkpoint trained with or without the
    shift loads unchanged (the shift comes from this config, not from the checkpoint). The wrapped backbone's
    outputs are returned as they are.

    Works on every backbone whose attention modules hold their projections as ``nn.Linear`` children named
    ``qkv`` (mmdet's SwinTransformer WindowMSA, ViTDetViT / CondViT, mmpretrain's MultiheadAttention,
    WindowMSA, XCiT's XCA), ``q``/``kv`` or ``q``/``k``/``v`` (mmpretrain's class attention).

    Args:
        backbone (dict): config of the wrapped backbone, e.g. mmdet's ``dict(type='SwinTransformer', ...)``,
            ``dict(type='ViTDetViT', ...)`` or ``dict(type='mmpretrain.XCiT', ...)``.
        lam (float): lambda, the multiple of the identity added to each projection, >= 0; 0 is the plain
            backbone. Default: 10.0 (the paper's value).
        targets (Sequence[str], optional): names (as in the wrapped backbone's ``named_modules()``) of the
            attention modules to condition; None: every attention module found. Default: None.
        init_cfg (dict, optional): initialization of the wrapper itself; pretrained weights belong in the
            wrapped backbone's ``init_cfg``. Default: None.
    """

    def __init__(self,
                 backbone: dict,
                 lam: float = 10.0,
                 targets: Optional[Sequence[str]] = None,
                 init_cfg: Optional[dict] = None):
        super().__init__(init_cfg=init_cfg)
        if isinstance(lam, bool) or not isinstance(lam, (int, float)) or not (math.isfinite(lam) and lam >= 0):
            raise ValueError(f'SpectralAttentionBackbone: lam={lam!r} is invalid; use a finite number >= 0 '
                             '(the paper uses 10.0; 0 is the plain backbone)')
        self.wrapped = MODELS.build(backbone)
        self.lam = float(lam)
        where = f'SpectralAttentionBackbone({type(self.wrapped).__name__})'
        self.projections = [name for name, _ in attention_projections(self.wrapped, targets, where)]
        modules = dict(self.wrapped.named_modules())
        for name in self.projections:
            # A bound method, so that a deep copy of the model (e.g. an EMA copy) hooks the copied wrapper.
            modules[name].register_forward_hook(self._shift)

    def _shift(self, linear: nn.Linear, args: tuple, output: torch.Tensor) -> torch.Tensor:
        return add_scaled_identity(output, args[0], self.lam) if self.lam else output

    def extra_repr(self) -> str:
        return f'lam={self.lam}, {len(self.projections)} projections'
