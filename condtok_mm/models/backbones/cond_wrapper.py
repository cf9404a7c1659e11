"""CondTokBackbone: conditioned embedded tokens for any backbone, through forward hooks."""
from collections import OrderedDict
from typing import Optional, Sequence, Tuple

import torch
import torch.nn as nn
from mmengine.model import BaseModule

from condtok_mm.models.valid_region import BatchValidRegion, batch_valid_region, valid_token_shapes
from condtok_mm.registry import MODELS

TOKEN_LAYOUTS = ('auto', 'BNC', 'BHWC', 'BCHW')


def condition_layout(conditioner: nn.Module, tokens: torch.Tensor, layout: str,
                     hw_shape: Optional[Tuple[int, int]] = None,
                     region: Optional[BatchValidRegion] = None) -> torch.Tensor:
    """Condition each image's token matrix of a tensor in one of TOKEN_LAYOUTS; same layout back.

    'auto' reads a 3-D tensor as (B, N, C) and a 4-D tensor as (B, C, H, W), PyTorch's convention for
    feature maps; channel-last maps (B, H, W, C), such as ViTDet's patch embedding, need 'BHWC'. The token
    grid that a per-window conditioner needs is the map's (H, W), or ``hw_shape`` for (B, N, C) tokens.
    With the batch's valid ``region`` each image is conditioned on its valid tokens only.
    """
    if layout == 'auto':
        if tokens.dim() not in (3, 4):
            raise ValueError(f'{conditioner.location}: cannot read a {tokens.dim()}-D tensor of shape '
                             f'{tuple(tokens.shape)} as tokens; expected (B, N, C) or (B, C, H, W)')
        layout = 'BNC' if tokens.dim() == 3 else 'BCHW'
    if tokens.dim() != len(layout):
        raise ValueError(f'{conditioner.location}: token_layout={layout!r} does not fit a tensor of shape '
                         f'{tuple(tokens.shape)}; valid layouts are {", ".join(TOKEN_LAYOUTS)}')
    if layout == 'BNC':
        if hw_shape is None and getattr(conditioner, 'scope', 'image') == 'window':
            raise ValueError(f"{conditioner.location}: scope='window' needs the token grid, and this output "
                             f'is (B, N, C) tokens {tuple(tokens.shape)} without an (H, W) beside them; '
                             "condition a submodule whose output is a feature map (token_layout 'BHWC' or "
                             "'BCHW') or a (tokens, hw_shape) tuple such as mmdet's and mmpretrain's "
                             "PatchEmbed, or use scope='image'")
        if hw_shape is None:
            if region is not None and any(shape != region.batch_hw for shape in region.img_shapes):
                raise ValueError(f'{conditioner.location}: this batch is padded, and (B, N, C) tokens '
                                 f'{tuple(tokens.shape)} without an (H, W) beside them do not say which '
                                 'tokens are padding; condition a submodule whose output is a feature map '
                                 "(token_layout 'BHWC' or 'BCHW') or a (tokens, hw_shape) tuple")
            return conditioner(tokens)
        return conditioner(tokens, hw_shape, valid_token_shapes(region, hw_shape))
    if layout == 'BHWC':
        b, h, w, c = tokens.shape
        return conditioner(tokens.reshape(b, h * w, c), (h, w),
                           valid_token_shapes(region, (h, w))).reshape(b, h, w, c)
    b, c, h, w = tokens.shape
    matrix = tokens.flatten(2).transpose(1, 2)
    return conditioner(matrix, (h, w), valid_token_shapes(region, (h, w))).transpose(1, 2).reshape(b, c, h, w)


def _grid_of(output: tuple) -> Optional[Tuple[int, int]]:
    """The (H, W) of a (tokens, hw_shape, ...) output, as mmdet's and mmpretrain's PatchEmbed return."""
    if len(output) > 1 and isinstance(output[1], (tuple, list, torch.Size)) and len(output[1]) == 2 \
            and all(isinstance(v, int) for v in output[1]):
        return tuple(output[1])
    return None


class TransparentWrapper(BaseModule):
    """A module around ``self.wrapped`` whose state dict has exactly the wrapped module's keys.

    Checkpoints of the wrapped module (and detectors' checkpoints, through ``load_from``) then load with
    no key remapping, and the wrapper's own checkpoints load into the unwrapped module.
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


class OutputConditioner(nn.Module):
    """Holds a conditioner and the layout of the output it conditions; its :meth:`hook` is registered as
    a forward hook (a bound method, so a deep copy of the model hooks the copied conditioner)."""

    def __init__(self, conditioner: nn.Module, layout: str):
        super().__init__()
        self.conditioner = conditioner
        self.layout = layout
        # The valid region of the batch the wrapped backbone is running on (set by CondTokBackbone.forward).
        self.region: Optional[BatchValidRegion] = None

    def hook(self, module, args, output):
        if isinstance(output, tuple):  # e.g. (tokens, hw_shape)
            return (condition_layout(self.conditioner, output[0], self.layout, _grid_of(output),
                                     self.region), ) + output[1:]
        return condition_layout(self.conditioner, output, self.layout, region=self.region)


@MODELS.register_module()
class CondTokBackbone(TransparentWrapper):
    """Any backbone, with the token output of chosen submodules conditioned.

    A forward hook replaces the output of each module named in ``targets`` (default: the patch embedding)
    by its conditioned tokens; tuple outputs such as ``(x, hw_shape)`` keep their other elements. The
    conditioner has no parameters and the state dict has the wrapped backbone's keys, so its pretrained
    weights load unchanged through its own ``init_cfg`` or through ``load_from``.

    In a padded detection batch each image is conditioned on its own valid tokens, as recorded by
    :class:`ValidRegionDetDataPreprocessor` for the batch tensor this backbone receives (the targets' token
    grids must then be known: feature maps or (tokens, hw_shape) outputs); without such a record every
    token counts as valid.

    Args:
        backbone (dict): config of the wrapped backbone, e.g. ``dict(type='mmpretrain.VisionTransformer',
            arch='b')`` or an mmdet backbone by bare name.
        conditioning (dict, optional): conditioner config; None disables the conditioning (then the
            outputs are exactly the wrapped backbone's). ``scope='window'`` (with ``window_size``) needs the
            token grid: it works on feature-map outputs and on (tokens, hw_shape) outputs such as mmdet's
            and mmpretrain's PatchEmbed, and raises on bare (B, N, C) tokens.
            Default: ``dict(type='TokenConditioner')``.
        targets (Sequence[str]): names of submodules of the wrapped backbone (as in
            ``named_modules()``) whose outputs are conditioned. Default: ('patch_embed',).
        token_layout (str): how to read the targets' output tensors: 'auto' ((B, N, C) for 3-D, (B, C, H, W)
            for 4-D), 'BNC', 'BHWC' or 'BCHW'. Default: 'auto'.
        init_cfg (dict, optional): initialization of the wrapper itself; pretrained weights belong in the
            wrapped backbone's ``init_cfg``. Default: None.
    """

    def __init__(self,
                 backbone: dict,
                 conditioning: Optional[dict] = dict(type='TokenConditioner'),
                 targets: Sequence[str] = ('patch_embed', ),
                 token_layout: str = 'auto',
                 init_cfg: Optional[dict] = None):
        super().__init__(init_cfg=init_cfg)
        if token_layout not in TOKEN_LAYOUTS:
            raise ValueError(f'CondTokBackbone: token_layout={token_layout!r} is not supported; valid '
                             f'layouts are {", ".join(TOKEN_LAYOUTS)}')
        self.wrapped = MODELS.build(backbone)
        modules = dict(self.wrapped.named_modules())
        missing = [t for t in targets if t not in modules or t == '']
        if missing:
            candidates = [n for n in modules if n and '.' not in n]
            raise ValueError(f'CondTokBackbone: {type(self.wrapped).__name__} has no submodule named '
                             f'{", ".join(map(repr, missing))}; its top-level submodules are '
                             f'{", ".join(candidates)}')
        self.token_layout = token_layout
        self.targets = tuple(targets) if conditioning is not None else ()
        self.conditioners = nn.ModuleDict()
        for target in self.targets:
            conditioner = MODELS.build(conditioning)
            conditioner.location = f'CondTokBackbone({type(self.wrapped).__name__}).{target}'
            output_conditioner = OutputConditioner(conditioner, token_layout)
            self.conditioners[target.replace('.', '__')] = output_conditioner
            modules[target].register_forward_hook(output_conditioner.hook)

    def forward(self, *args, **kwargs):
        region = batch_valid_region(args[0]) if args and isinstance(args[0], torch.Tensor) else None
        for output_conditioner in self.conditioners.values():
            output_conditioner.region = region
        try:
            return self.wrapped(*args, **kwargs)
        finally:
            for output_conditioner in self.conditioners.values():
                output_conditioner.region = None

    def train(self, mode: bool = True):
        # some wrapped backbones (mmdet's SwinTransformer) override train() and return None
        super().train(mode)
        return self
