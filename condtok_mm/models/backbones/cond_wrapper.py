"""CondTokBackbone: conditioned embedded tokens for any backbone, through forward hooks."""
from typing import Optional, Sequence

import torch
import torch.nn as nn

from condtok_mm.models.arguments import check_conditioned_somewhere, check_conditioning, check_names
from condtok_mm.models.layout import output_layout, output_token_grid
from condtok_mm.models.placement import build_conditioner, check_token_layout
from condtok_mm.models.valid_region import BatchValidRegion, batch_valid_region
from condtok_mm.models.wrappers import TransparentWrapper, condition_layout
from condtok_mm.registry import MODELS


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
        tokens = output[0] if isinstance(output, tuple) else output  # e.g. (tokens, hw_shape)
        layout = output_layout(module, tokens, self.conditioner.where) if self.layout == 'auto' else self.layout
        if isinstance(output, tuple):
            return (condition_layout(self.conditioner, tokens, layout, output_token_grid(output), self.region),
                    ) + output[1:]
        return condition_layout(self.conditioner, tokens, layout, region=self.region)


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
            and mmpretrain's PatchEmbed, and raises on bare (B, N, C) tokens. The targets' outputs are what is
            conditioned: ``position='attention_input'`` is refused (name a block's first norm in ``targets`` to
            condition what its attention multiplies). A dict or None. Default: ``dict(type='TokenConditioner')``.
        targets (Sequence[str]): distinct names of submodules of the wrapped backbone (as in
            ``named_modules()``) whose outputs are conditioned; empty only with ``conditioning=None``.
            Default: ('patch_embed',).
        token_layout (str): how to read the targets' output tensors: 'BNC', 'BHWC', 'BCHW' or 'auto': (B, N, C)
            for 3-D, and for 4-D the layout of the modules it knows (ViTDet's patch embedding (B, H, W, C), a
            convolution (B, C, H, W)); any other 4-D output raises, naming the layouts to choose from.
            Default: 'auto'.
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
        conditioning = check_conditioning(conditioning, 'CondTokBackbone')
        targets = check_names(targets, 'targets', 'CondTokBackbone', "('patch_embed', )")
        check_conditioned_somewhere(conditioning, targets, 'targets', 'CondTokBackbone', "('patch_embed', )")
        check_token_layout(token_layout, 'CondTokBackbone', auto=True)
        self.wrapped = MODELS.build(backbone)
        modules = dict(self.wrapped.named_modules())
        missing = [t for t in targets if t not in modules or t == '']
        if missing:
            candidates = [n for n in modules if n and '.' not in n]
            raise ValueError(f'CondTokBackbone: {type(self.wrapped).__name__} has no submodule named '
                             f'{", ".join(map(repr, missing))}; its top-level submodules are '
                             f'{", ".join(candidates)}')
        self.token_layout = token_layout
        self.targets = targets if conditioning is not None else ()
        self.conditioners = nn.ModuleDict()
        for target in self.targets:
            conditioner = build_conditioner(
                conditioning, f'CondTokBackbone({type(self.wrapped).__name__}).{target}', ('embedding', ),
                unsupported="CondTokBackbone conditions its targets' outputs; to condition what a block's attention "
                "multiplies, name the block's first norm as a target, e.g. targets=('stages.0.blocks.0.norm1', )",
                token_grid=token_layout != 'BNC')
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
