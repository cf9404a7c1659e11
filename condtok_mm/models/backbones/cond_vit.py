"""CondViT: ViTDet's plain ViT with conditioned embedded tokens."""
from typing import Optional

import torch

from condtok_mm.models.arguments import check_conditioning
from condtok_mm.models.backbones.vitdet_vit import ViTDetViT
from condtok_mm.models.layout import first_attention_blocks
from condtok_mm.models.placement import CONDITIONING_POSITIONS, build_conditioner
from condtok_mm.models.valid_region import batch_valid_region, valid_token_shapes
from condtok_mm.registry import MODELS


@MODELS.register_module()
class CondViT(ViTDetViT):
    """ViTDet's plain ViT whose embedded tokens are conditioned before the first block.

    Identical to :class:`ViTDetViT` (same arguments, parameters and state-dict keys as mmdet's
    projects/ViTDet ``ViT``, so its checkpoints and MAE weights load unchanged) plus a parameter-free
    :class:`TokenConditioner` applied per image to the (H*W, C) token matrix.

    In a padded detection batch each image is conditioned on its own valid tokens, as recorded by
    :class:`ValidRegionDetDataPreprocessor` for the batch tensor this backbone receives; called without such a
    record (a bare tensor) every token counts as valid.

    Args:
        conditioning (dict, optional): config of the conditioner, e.g.
            ``dict(type='TokenConditioner', mode='sigma_max')``. ``None`` disables the conditioning, and
            the backbone then computes exactly what ViTDetViT computes. With ``scope='window'`` each
            window of the first block is conditioned on its own (that block must be a window block);
            window_size defaults to the block's. With ``position='attention_input'`` the conditioner acts
            on the first block's norm1 output instead of on the embedded tokens; only with ``scope='window'``
            too is the bound met by exactly what a window block's attention multiplies (with ``scope='image'``
            the whole image's norm1 output is conditioned and its windows keep their own, larger kappa). A dict
            or None. Default: ``dict(type='TokenConditioner')``.
        condition_after_pos_embed (bool): False conditions the patch-embedding output, before the
            absolute position embedding is added (the paper: the embedded tokens); True conditions the
            tokens the first block receives, position embedding included. Default: False.
        **kwargs: every argument of ViTDetViT (img_size, patch_size, in_chans, embed_dim, depth,
            num_heads, mlp_ratio, qkv_bias, drop_path_rate, norm_cfg, act_cfg, use_abs_pos, use_rel_pos,
            rel_pos_zero_init, window_size, window_block_indexes, pretrain_img_size,
            pretrain_use_cls_token, with_cp, init_cfg), with its defaults.
    """

    def __init__(self,
                 conditioning: Optional[dict] = dict(type='TokenConditioner'),
                 condition_after_pos_embed: bool = False,
                 **kwargs):
        conditioning = check_conditioning(conditioning, type(self).__name__)
        super().__init__(**kwargs)
        if not isinstance(condition_after_pos_embed, bool):
            raise ValueError(f'CondViT: condition_after_pos_embed={condition_after_pos_embed!r} is '
                             'invalid; use True or False')
        if condition_after_pos_embed and self.pos_embed is None:
            raise ValueError('CondViT: condition_after_pos_embed=True but use_abs_pos=False: there is no '
                             'position embedding to condition after')
        self.condition_after_pos_embed = condition_after_pos_embed
        first_block, first_window, _ = first_attention_blocks(self)[0]  # ViTDet's windows are never shifted
        names = dict(embedding='position embedding' if condition_after_pos_embed else 'patch embedding',
                     attention_input='block 0 attention input')
        # Parameter-free: the state dict stays that of ViTDetViT. Window 0 is global attention.
        self.conditioner = None if conditioning is None else build_conditioner(
            conditioning, f'CondViT {names["embedding"]}', CONDITIONING_POSITIONS, attention_window=(first_window, 0),
            name=lambda position: f'CondViT {names[position]}')
        self.conditions_attention_input = self.conditioner is not None and \
            self.conditioner.position == 'attention_input'
        if self.conditions_attention_input:
            if condition_after_pos_embed:
                raise ValueError("CondViT: condition_after_pos_embed=True conditions the embedded tokens, "
                                 "position='attention_input' the first block's norm1 output; choose one")
            first_block.norm1.register_forward_hook(self._condition_attention_input)
        # The valid token grids of the batch being run, for the attention-input hook.
        self._valid_shapes = None

    def _condition(self, x: torch.Tensor) -> torch.Tensor:
        """Condition the (B, H, W, C) grid as one (H*W, C) token matrix per image (or per window), each
        image on its valid tokens."""
        batch, height, width, channels = x.shape
        tokens = self.conditioner(x.reshape(batch, height * width, channels), (height, width),
                                  self._valid_shapes)
        return tokens.view(batch, height, width, channels)

    def _condition_attention_input(self, norm, args, output: torch.Tensor) -> torch.Tensor:
        return self._condition(output)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        region = batch_valid_region(x)
        x = self.patch_embed(x)
        self._valid_shapes = valid_token_shapes(region, x.shape[1:3], tuple(self.patch_embed.proj.stride))
        conditions_embedding = self.conditioner is not None and not self.conditions_attention_input
        if conditions_embedding and not self.condition_after_pos_embed:
            x = self._condition(x)
        x = self.add_abs_pos_embed(x)
        if conditions_embedding and self.condition_after_pos_embed:
            x = self._condition(x)
        return self.forward_blocks(x)
