"""CondTokNeck: condition each input level's token matrix before any neck."""
from typing import Optional, Sequence

from condtok_mm.models.arguments import check_conditioned_somewhere, check_conditioning, check_indices
from condtok_mm.models.placement import build_conditioner, check_token_layout
from condtok_mm.models.valid_region import batch_valid_region
from condtok_mm.models.wrappers import TransparentWrapper, condition_layout
from condtok_mm.registry import MODELS


@MODELS.register_module()
class CondTokNeck(TransparentWrapper):
    """Any neck, with each input feature map's (H*W, C) token matrix conditioned per image first.

    This brings the conditioning to backbones without a token stage, e.g. ResNet features entering an
    FPN. The state dict has the wrapped neck's keys.

    In a padded detection batch each image is conditioned on its own valid tokens: the neck sees features,
    not the batch, and uses the valid region that :class:`ValidRegionDetDataPreprocessor` recorded for the
    live batch of its batch size (every token counts as valid without one).

    Args:
        neck (dict): config of the wrapped neck, e.g. ``dict(type='FPN', ...)``.
        conditioning (dict, optional): conditioner config; None disables it. With
            ``scope='window'`` (and ``window_size``) each level's map is conditioned window by window
            (not with token_layout 'BNC', which carries no grid). The input maps are what is conditioned:
            ``position='attention_input'`` is refused. A dict or None. Default: ``dict(type='TokenConditioner')``.
        levels (Sequence[int], optional): distinct indices of the input levels to condition (negative
            ones count from the last); None: all; empty only with ``conditioning=None``. Default: None.
        token_layout (str): layout of the input tensors, 'BCHW' (feature maps, the default), 'BHWC' or
            'BNC'.
        init_cfg (dict, optional): initialization of the wrapper itself. Default: None.
    """

    def __init__(self,
                 neck: dict,
                 conditioning: Optional[dict] = dict(type='TokenConditioner'),
                 levels: Optional[Sequence[int]] = None,
                 token_layout: str = 'BCHW',
                 init_cfg: Optional[dict] = None):
        super().__init__(init_cfg=init_cfg)
        conditioning = check_conditioning(conditioning, 'CondTokNeck')
        if levels is not None:
            levels = check_indices(levels, 'levels', None, 'CondTokNeck', 'level indices (negative from the last)',
                                   '(0, 2), or None for every level')
            check_conditioned_somewhere(conditioning, levels, 'levels', 'CondTokNeck', '(0, ) or levels=None')
        check_token_layout(token_layout, 'CondTokNeck', auto=False)
        self.wrapped = MODELS.build(neck)
        self.levels = levels
        self.token_layout = token_layout
        self.conditioner = None if conditioning is None else build_conditioner(
            conditioning, f'CondTokNeck({type(self.wrapped).__name__})', ('embedding', ),
            unsupported='CondTokNeck conditions the feature maps the neck receives; the backbone decides what '
            'its attention multiplies', token_grid=token_layout != 'BNC')

    def forward(self, inputs):
        if self.conditioner is None:
            return self.wrapped(inputs)
        levels = range(len(inputs)) if self.levels is None else self.levels
        invalid = [i for i in levels if not -len(inputs) <= i < len(inputs)]
        if invalid:
            raise ValueError(f'CondTokNeck: levels {invalid} do not exist; the neck gets {len(inputs)} '
                             f'levels (0..{len(inputs) - 1})')
        chosen = {i % len(inputs) for i in levels}
        region = batch_valid_region(batch_size=inputs[0].shape[0])
        conditioned = [condition_layout(self.conditioner, x, self.token_layout, region=region)
                       if i in chosen else x for i, x in enumerate(inputs)]
        return self.wrapped(tuple(conditioned))
