"""CondViT: ViTDet's plain ViT with conditioned embedded tokens."""
from typing import Optional

import torch

from condtok_mm.models.backbones.vitdet_vit import ViTDetViT
from condtok_mm.models.token_conditioner import build_token_conditioner
from condtok_mm.registry import MODELS


@MODELS.register_module()
class CondViT(ViTDetViT):
    """ViTDet's plain ViT whose embedded tokens are conditioned before the first block.

    Identical to :class:`ViTDetViT` (same arguments, parameters and state-dict keys as mmdet's
    projects/ViTDet ``ViT``, so its checkpoints and MAE weights load unchanged) plus a parameter-free
    :class:`TokenConditioner` applied per image to the (H*W, C) token matrix.

    Args:
        conditioning (dict, optional): config of the conditioner, e.g.
            ``dict(type='TokenConditioner', mode='sigma_max')``. ``None`` disables the conditioning, and
            the backbone then computes exactly what ViTDetViT computes. With ``scope='window'`` each
            window of the first block is conditioned on its own (that block must be a window block);
            window_size defaults to the block's. Default: ``dict(type='TokenConditioner')``.
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
        super().__init__(**kwargs)
        if not isinstance(condition_after_pos_embed, bool):
            raise ValueError(f'CondViT: condition_after_pos_embed={condition_after_pos_embed!r} is '
                             'invalid; use True or False')
        if condition_after_pos_embed and self.pos_embed is None:
            raise ValueError('CondViT: condition_after_pos_embed=True but use_abs_pos=False: there is no '
                             'position embedding to condition after')
        self.condition_after_pos_embed = condition_after_pos_embed
        first_window = self.blocks[0].window_size  # ViTDet's windows are never shifted
        where = 'position embedding' if condition_after_pos_embed else 'patch embedding'
        # Parameter-free: the state dict stays that of ViTDetViT.
        self.conditioner = None if conditioning is None else build_token_conditioner(
            conditioning, f'{type(self).__name__} {where}',
            attention_window=(first_window, 0) if first_window > 0 else None)

    def _condition(self, x: torch.Tensor) -> torch.Tensor:
        """Condition the (B, H, W, C) grid as one (H*W, C) token matrix per image (or per window)."""
        if self.conditioner is None:
            return x
        batch, height, width, channels = x.shape
        tokens = self.conditioner(x.reshape(batch, height * width, channels), hw_shape=(height, width))
        return tokens.view(batch, height, width, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x)
        if not self.condition_after_pos_embed:
            x = self._condition(x)
        x = self.add_abs_pos_embed(x)
        if self.condition_after_pos_embed:
            x = self._condition(x)
        return self.forward_blocks(x)
