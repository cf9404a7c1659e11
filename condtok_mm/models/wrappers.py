"""What the generic wrappers share: a state dict with the wrapped module's keys, and conditioning a tensor of
tokens in whichever layout the wrapped module produces.

:class:`TransparentWrapper` is the base of CondTokBackbone, SpectralAttentionBackbone and CondTokNeck;
:func:`condition_layout` is how CondTokBackbone's hooks and CondTokNeck condition what they are given.
"""
from typing import Optional, Tuple

import torch
import torch.nn as nn
from mmengine.model import BaseModule

from condtok_mm.models.placement import TOKEN_LAYOUTS, missing_grid
from condtok_mm.models.valid_region import BatchValidRegion, valid_token_shapes
from condtok_mm.models.weights_only_init import WeightsOnlyInit

__all__ = ['TransparentWrapper', 'condition_layout']


class TransparentWrapper(WeightsOnlyInit, BaseModule):
    """A module around ``self.wrapped`` whose state dict has exactly the wrapped module's keys.

    Checkpoints of the wrapped module (and detectors' checkpoints, through ``load_from``) then load with
    no key remapping, and the wrapper's own checkpoints load into the unwrapped module. Every checkpoint its
    ``init_weights`` loads, the wrapped module's included, is read weights-only (:class:`WeightsOnlyInit`). A
    subclass sets ``self.wrapped`` in its ``__init__``; its forward is the wrapped module's unless it overrides it.

    Args:
        init_cfg (dict, optional): initialization of the wrapper itself; pretrained weights belong in the
            wrapped module's ``init_cfg``. Default: None.
    """

    def __init__(self, init_cfg: Optional[dict] = None):
        super().__init__(init_cfg=init_cfg)
        self._register_state_dict_hook(self._strip_wrapped_prefix)
        self._register_load_state_dict_pre_hook(self._add_wrapped_prefix)

    @staticmethod
    def _strip_wrapped_prefix(module, state_dict, prefix, local_metadata):
        inner = prefix + 'wrapped.'
        for key in [k for k in state_dict if k.startswith(inner)]:
            state_dict[prefix + key[len(inner):]] = state_dict.pop(key)
        return state_dict

    @staticmethod
    def _add_wrapped_prefix(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                            error_msgs):
        for key in [k for k in state_dict if k.startswith(prefix)
                    and not k.startswith(prefix + 'wrapped.')]:
            state_dict[prefix + 'wrapped.' + key[len(prefix):]] = state_dict.pop(key)

    def forward(self, *args, **kwargs):
        return self.wrapped(*args, **kwargs)


def condition_layout(conditioner: nn.Module, tokens: torch.Tensor, layout: str,
                     hw_shape: Optional[Tuple[int, int]] = None,
                     region: Optional[BatchValidRegion] = None) -> torch.Tensor:
    """Condition each image's token matrix of a tensor in 'BNC', 'BHWC' or 'BCHW' layout; same layout back
    ('auto' is resolved by the caller, which knows the module: :func:`condtok_mm.models.layout.output_layout`).
    The token grid that a per-window conditioner needs is the map's (H, W), or ``hw_shape`` for (B, N, C) tokens.
    With the batch's valid ``region`` each image is conditioned on its valid tokens only; (B, N, C) tokens without
    their grid are refused where the conditioner needs it (:func:`.placement.missing_grid`).
    """
    where = conditioner.where
    if tokens.dim() != len(layout):
        raise ValueError(f'{where}: token_layout={layout!r} does not fit a tensor of shape '
                         f'{tuple(tokens.shape)}; valid layouts are {", ".join(TOKEN_LAYOUTS)}')
    if layout == 'BNC':
        if hw_shape is None:
            if region is not None and any(shape != region.batch_hw for shape in region.img_shapes):
                raise missing_grid(where, 'a padded batch (to tell its padding from its tokens)', tokens.shape)
            return conditioner(tokens)
        return conditioner(tokens, hw_shape, valid_token_shapes(region, hw_shape, where=where))
    if layout == 'BHWC':
        b, h, w, c = tokens.shape
        return conditioner(tokens.reshape(b, h * w, c), (h, w),
                           valid_token_shapes(region, (h, w), where=where)).reshape(b, h, w, c)
    b, c, h, w = tokens.shape
    matrix = tokens.flatten(2).transpose(1, 2)
    valid_shapes = valid_token_shapes(region, (h, w), where=where)
    return conditioner(matrix, (h, w), valid_shapes).transpose(1, 2).reshape(b, c, h, w)
