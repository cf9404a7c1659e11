"""CondSwinTransformer: mmdet's SwinTransformer with conditioned embedded tokens."""
from functools import partial
from typing import Optional, Sequence

import torch
import torch.nn as nn
from mmdet.models.backbones import SwinTransformer

from condtok_mm.models.arguments import check_conditioned_somewhere, check_conditioning, check_indices
from condtok_mm.models.layout import first_attention_blocks
from condtok_mm.models.placement import CONDITIONING_POSITIONS, build_conditioner
from condtok_mm.models.valid_region import batch_valid_region, valid_token_shapes
from condtok_mm.models.weights_only_init import WeightsOnlyInit
from condtok_mm.registry import MODELS


@MODELS.register_module()
class CondSwinTransformer(WeightsOnlyInit, SwinTransformer):
    """Swin Transformer whose token matrices are conditioned before they enter the chosen stages.

    Identical to :class:`mmdet.models.backbones.SwinTransformer` (same arguments, same parameters and
    state-dict keys, so mmdet/mmpretrain Swin checkpoints load unchanged) plus a parameter-free
    :class:`TokenConditioner` applied per image to the (H*W, C) token matrix at the stages listed in
    ``condition_stages``.

    In a padded detection batch each image is conditioned on its own valid tokens, as recorded by
    :class:`ValidRegionDetDataPreprocessor` for the batch tensor this backbone receives; called without such a
    record (mmpretrain classification, a bare tensor) every token counts as valid.

    Args:
        conditioning (dict, optional): config of the conditioner, e.g.
            ``dict(type='TokenConditioner', mode='sigma_max')``. ``None`` disables the conditioning, and
            the backbone then computes exactly what SwinTransformer computes. With
            ``scope='window'`` each window of the stage's first (unshifted) attention block is
            conditioned on its own; window_size and shift_size default to that block's (other values are
            refused). With ``position='attention_input'`` the conditioner acts on the norm1 output of the stage's
            first block instead of on the stage input; only with ``scope='window'`` too is the bound met by
            exactly what its windowed attention multiplies (with ``scope='image'`` the windows keep their own,
            larger kappa). A dict or None.
            Default: ``dict(type='TokenConditioner')``.
        condition_stages (Sequence[int]): where to condition. 0 is the patch-embedding output, before any
            absolute position embedding (the paper: before the first transformer block); i in 1..3 is the
            input of stage i, i.e. the output of the preceding patch merging. Distinct stage indices; empty
            only with ``conditioning=None`` (a conditioning config with no stage is refused, since it would
            build the unconditioned backbone). Default: (0,).
        **kwargs: every argument of SwinTransformer (pretrain_img_size, in_channels, embed_dims,
            patch_size, window_size, mlp_ratio, depths, num_heads, strides, out_indices, qkv_bias,
            qk_scale, patch_norm, drop_rate, attn_drop_rate, drop_path_rate, use_abs_pos_embed, act_cfg,
            norm_cfg, with_cp, pretrained, convert_weights, frozen_stages, init_cfg), with its defaults.
    """

    def __init__(self,
                 conditioning: Optional[dict] = dict(type='TokenConditioner'),
                 condition_stages: Sequence[int] = (0,),
                 **kwargs):
        where = type(self).__name__
        conditioning = check_conditioning(conditioning, where)
        super().__init__(**kwargs)
        stages = check_indices(condition_stages, 'condition_stages', len(self.stages), where, 'stage indices',
                               '(0, ) (0 = patch-embedding output, i = input of stage i)')
        check_conditioned_somewhere(conditioning, stages, 'condition_stages', where, '(0, )')
        self.condition_stages = stages if conditioning is not None else ()
        # Parameter-free, so the ModuleDict adds no state-dict keys; one conditioner per stage keeps the
        # per-stage statistics and error messages apart.
        self.conditioners = nn.ModuleDict()
        first_blocks = first_attention_blocks(self)
        for stage in self.condition_stages:
            first_block, window_size, shift_size = first_blocks[stage]  # its attention is unshifted
            conditioner = build_conditioner(conditioning, f'{where} stage {stage}', CONDITIONING_POSITIONS,
                                            attention_window=(window_size, shift_size))
            self.conditioners[str(stage)] = conditioner
            if conditioner.position == 'attention_input':
                first_block.norm1.register_forward_hook(partial(self._condition_attention_input, stage))
        # The token grid and valid region of the stage being run, for the attention-input hooks.
        self._stage_grid = {}
        # Pixels per token of each stage's input: the patch embedding's stride times each patch merging's before
        # it (what a valid pixel size is divided by; the batch need not be a multiple of it).
        stride = tuple(self.patch_embed.projection.stride)
        self._token_strides = [stride]
        for stage in self.stages[:-1]:
            stride = tuple(s * t for s, t in zip(stride, stage.downsample.sampler.stride))
            self._token_strides.append(stride)

    def _condition(self, stage: int, tokens, hw_shape, valid_shapes):
        conditioner = self.conditioners[str(stage)] if str(stage) in self.conditioners else None
        if conditioner is None or conditioner.position != 'embedding':
            return tokens
        return conditioner(tokens, hw_shape, valid_shapes)

    def _condition_attention_input(self, stage: int, norm, args, output: torch.Tensor) -> torch.Tensor:
        hw_shape, valid_shapes = self._stage_grid[stage]
        return self.conditioners[str(stage)](output, hw_shape, valid_shapes)

    def forward(self, x):
        region = batch_valid_region(x)
        x, hw_shape = self.patch_embed(x)
        valid_shapes = valid_token_shapes(region, hw_shape, self._token_strides[0])
        self._stage_grid[0] = (hw_shape, valid_shapes)
        x = self._condition(0, x, hw_shape, valid_shapes)

        if self.use_abs_pos_embed:
            x = x + self.absolute_pos_embed
        x = self.drop_after_pos(x)

        outs = []
        for i, stage in enumerate(self.stages):
            if i > 0:
                valid_shapes = valid_token_shapes(region, hw_shape, self._token_strides[i])
                self._stage_grid[i] = (hw_shape, valid_shapes)
                x = self._condition(i, x, hw_shape, valid_shapes)
            x, hw_shape, out, out_hw_shape = stage(x, hw_shape)
            if i in self.out_indices:
                norm_layer = getattr(self, f'norm{i}')
                out = norm_layer(out)
                out = out.view(-1, *out_hw_shape,
                               self.num_features[i]).permute(0, 3, 1, 2).contiguous()
                outs.append(out)
        return outs
