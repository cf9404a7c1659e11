"""ViTDetViT: the plain ViT backbone of ViTDet, with the parameters and state-dict keys of mmdet's projects/ViTDet.

Y. Li, H. Mao, R. Girshick and K. He, "Exploring Plain Vision Transformer Backbones for Object Detection",
ECCV 2022. mmdet 3.3.0 carries this backbone as ``ViT`` in ``projects/ViTDet/vitdet/vit.py``, which the pip
wheel does not ship; this is our own implementation of the same computation under a name that cannot clash
with it, so a user can import both.
"""
import math
from typing import Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint as cp
from mmcv.cnn import build_activation_layer, build_norm_layer
from mmcv.cnn.bricks import DropPath
from mmengine.logging import MMLogger
from mmengine.model import BaseModule
from mmengine.runner.checkpoint import CheckpointLoader

from condtok_mm.compat.checkpoint_loading import weights_only_loading
from condtok_mm.models.attention_windows import window_partition, window_unpartition
from condtok_mm.registry import MODELS

# Keys of an MAE-pretrained ViT that ViTDet does not use (the class token, the final norm, the MAE decoder).
MAE_ONLY_KEY_PREFIXES = ('cls_token', 'mask_token', 'norm.', 'fc_norm.', 'head.', 'decoder_')


def relative_position_table(rel_pos: torch.Tensor, size: int) -> torch.Tensor:
    """(size, size, C) embeddings of the offsets between every query and key position along one axis.

    ``rel_pos`` holds one embedding per offset -(L-1)..(L-1), L the size it was made for; at another size
    it is linearly resized to 2 * size - 1 offsets first (global blocks at an input size other than
    ``img_size``).
    """
    num_offsets = 2 * size - 1
    if rel_pos.shape[0] != num_offsets:
        rel_pos = F.interpolate(rel_pos.t().unsqueeze(0), size=num_offsets, mode='linear')[0].t()
    positions = torch.arange(size, device=rel_pos.device)
    return rel_pos[positions[:, None] - positions[None, :] + (size - 1)]


class ViTDetAttention(nn.Module):
    """Multi-head self-attention over a (B, H, W, C) token grid with decomposed relative position bias.

    The logit of query i and key j gets q_i . R_h[h_i - h_j] + q_i . R_w[w_i - w_j] added (MViTv2's
    decomposed relative positions), with the unscaled query. The softmax is the module ``softmax`` so that
    a forward hook can record the attention probabilities, of shape (B, num_heads, H * W, H * W) as in
    mmdet's and mmpretrain's attention modules (B counts windows times images in a window block).

    Args:
        dim (int): channels of the tokens.
        num_heads (int): number of heads. Default: 8.
        qkv_bias (bool): bias in the query/key/value projection. Default: True.
        use_rel_pos (bool): add the decomposed relative position bias. Default: False.
        rel_pos_zero_init (bool): start the relative position embeddings at zero (else truncated normal,
            std 0.02). Default: True.
        input_size (tuple[int, int], optional): the (H, W) grid the relative position embeddings are made
            for; required with ``use_rel_pos``. Default: None.
    """

    def __init__(self,
                 dim: int,
                 num_heads: int = 8,
                 qkv_bias: bool = True,
                 use_rel_pos: bool = False,
                 rel_pos_zero_init: bool = True,
                 input_size: Optional[Tuple[int, int]] = None):
        super().__init__()
        self.num_heads = num_heads
        head_dim = dim // num_heads
        self.scale = head_dim**-0.5
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        self.softmax = nn.Softmax(dim=-1)
        self.use_rel_pos = use_rel_pos
        if use_rel_pos:
            if input_size is None:
                raise ValueError('ViTDetAttention: use_rel_pos=True needs input_size=(H, W)')
            self.rel_pos_h = nn.Parameter(torch.zeros(2 * input_size[0] - 1, head_dim))
            self.rel_pos_w = nn.Parameter(torch.zeros(2 * input_size[1] - 1, head_dim))
            if not rel_pos_zero_init:
                nn.init.trunc_normal_(self.rel_pos_h, std=0.02)
                nn.init.trunc_normal_(self.rel_pos_w, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, height, width, _ = x.shape
        num_tokens = height * width
        # q, k, v: (B, heads, H * W, head_dim)
        q, k, v = self.qkv(x).reshape(batch, num_tokens, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
        logits = (q * self.scale) @ k.transpose(-2, -1)
        if self.use_rel_pos:
            grid_q = q.reshape(-1, height, width, q.shape[-1])
            bias_h = torch.einsum('nhwc,hkc->nhwk', grid_q, relative_position_table(self.rel_pos_h, height))
            bias_w = torch.einsum('nhwc,wkc->nhwk', grid_q, relative_position_table(self.rel_pos_w, width))
            logits = (logits.view(-1, height, width, height, width) + bias_h[:, :, :, :, None] +
                      bias_w[:, :, :, None, :]).view(batch, self.num_heads, num_tokens, num_tokens)
        attn = self.softmax(logits)
        out = (attn @ v).view(batch, self.num_heads, height, width, -1).permute(0, 2, 3, 1, 4)
        return self.proj(out.reshape(batch, height, width, -1))


class ViTDetMlp(nn.Module):
    """The transformer block's two-layer MLP: fc1, activation, fc2."""

    def __init__(self, in_features: int, hidden_features: int, act_cfg: dict):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.act = build_activation_layer(act_cfg)
        self.fc2 = nn.Linear(hidden_features, in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class ViTDetBlock(nn.Module):
    """Pre-norm transformer block on a (B, H, W, C) grid, attending within windows or globally.

    Args:
        dim (int): channels.
        num_heads (int): attention heads.
        mlp_ratio (float): MLP hidden channels / dim. Default: 4.0.
        qkv_bias (bool): bias in the query/key/value projection. Default: True.
        drop_path (float): stochastic depth rate of both residual branches. Default: 0.
        norm_cfg (dict): the two norms. Default: LayerNorm, eps 1e-6.
        act_cfg (dict): the MLP activation. Default: GELU.
        use_rel_pos (bool): decomposed relative position bias in the attention. Default: False.
        rel_pos_zero_init (bool): zero-initialize the relative position embeddings. Default: True.
        window_size (int): attention window side; 0 attends globally. Default: 0.
        input_size (tuple[int, int], optional): the token grid of a global block, for its relative
            position embeddings (a window block's are made for the window). Default: None.
    """

    def __init__(self,
                 dim: int,
                 num_heads: int,
                 mlp_ratio: float = 4.0,
                 qkv_bias: bool = True,
                 drop_path: float = 0.,
                 norm_cfg: dict = dict(type='LN', eps=1e-6),
                 act_cfg: dict = dict(type='GELU'),
                 use_rel_pos: bool = False,
                 rel_pos_zero_init: bool = True,
                 window_size: int = 0,
                 input_size: Optional[Tuple[int, int]] = None):
        super().__init__()
        self.norm1 = build_norm_layer(norm_cfg, dim)[1]
        self.attn = ViTDetAttention(
            dim,
            num_heads=num_heads,
            qkv_bias=qkv_bias,
            use_rel_pos=use_rel_pos,
            rel_pos_zero_init=rel_pos_zero_init,
            input_size=(window_size, window_size) if window_size > 0 else input_size)
        self.drop_path = DropPath(drop_path) if drop_path > 0. else nn.Identity()
        self.norm2 = build_norm_layer(norm_cfg, dim)[1]
        self.mlp = ViTDetMlp(dim, int(dim * mlp_ratio), act_cfg)
        self.window_size = window_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x
        x = self.norm1(x)
        if self.window_size > 0:
            height, width = x.shape[1], x.shape[2]
            windows, padded_hw = window_partition(x, self.window_size)
            x = window_unpartition(self.attn(windows), self.window_size, padded_hw, (height, width))
        else:
            x = self.attn(x)
        x = shortcut + self.drop_path(x)
        return x + self.drop_path(self.mlp(self.norm2(x)))


class ViTDetPatchEmbed(nn.Module):
    """Non-overlapping patches to tokens: a strided convolution, output as a (B, H, W, C) grid."""

    def __init__(self, patch_size: int, in_chans: int, embed_dim: int):
        super().__init__()
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).permute(0, 2, 3, 1)


@MODELS.register_module()
class ViTDetViT(BaseModule):
    """The plain ViT of ViTDet: patch embedding, absolute position embedding, window and global blocks.

    Same parameters, state-dict keys and computation as ``ViT`` of mmdet 3.3.0's projects/ViTDet, so
    checkpoints made for that model load unchanged, and so do MAE-pretrained ViTs (``init_cfg``; their
    class token and final norm are not used, as in ViTDet). The absolute position embedding is made for
    ``pretrain_img_size`` and resized (bicubic, class token dropped) to the token grid of each input;
    any input size works: the window blocks pad the grid to a multiple of the window size, and a global
    block resizes its relative position embeddings. The output is one (B, embed_dim, H/16, W/16) map,
    for :class:`ViTDetFPN`.

    The defaults are ViTDet's ViT-B (mmdet's ViT defaults to window_size=0, use_rel_pos=False and
    drop_path_rate=0; the configs spell every argument out).

    Args:
        img_size (int): input size the global blocks' relative position embeddings are made for.
            Default: 1024.
        patch_size (int): patch side (kernel and stride of the patch embedding). Default: 16.
        in_chans (int): input channels. Default: 3.
        embed_dim (int): token channels. Default: 768.
        depth (int): number of blocks. Default: 12.
        num_heads (int): attention heads. Default: 12.
        mlp_ratio (float): MLP hidden channels / embed_dim. Default: 4.0.
        qkv_bias (bool): bias in the query/key/value projections. Default: True.
        drop_path_rate (float): stochastic depth, increasing linearly from 0 to this over the blocks.
            Default: 0.1.
        norm_cfg (dict): the blocks' norms. Default: ``dict(type='LN', eps=1e-6)``.
        act_cfg (dict): the MLP activation. Default: ``dict(type='GELU')``.
        use_abs_pos (bool): add the absolute position embedding. Default: True.
        use_rel_pos (bool): decomposed relative position bias in every attention. Default: True.
        rel_pos_zero_init (bool): zero-initialize the relative position embeddings. Default: True.
        window_size (int): attention window side of the window blocks; 0 makes every block global.
            Default: 14.
        window_block_indexes (Sequence[int]): the blocks that attend within windows; the others attend
            globally. Default: (0, 1, 3, 4, 6, 7, 9, 10), i.e. global blocks 2, 5, 8, 11.
        pretrain_img_size (int): input size of the pretraining, which fixes the size of the absolute
            position embedding. Default: 224.
        pretrain_use_cls_token (bool): the pretrained position embedding has a class-token entry first.
            Default: True.
        with_cp (bool): activation checkpointing of every block (saves memory, costs a second forward in
            backward, during which attention hooks fire again). Default: False.
        init_cfg (dict, optional): None (truncated-normal Linear layers, unit LayerNorms, ViTDet's
            initialization) or ``dict(type='Pretrained', checkpoint=...)``, a checkpoint holding a
            state dict under 'model' (MAE, ViTDet), under 'state_dict', or at its top level.
            Default: None.
    """

    def __init__(self,
                 img_size: int = 1024,
                 patch_size: int = 16,
                 in_chans: int = 3,
                 embed_dim: int = 768,
                 depth: int = 12,
                 num_heads: int = 12,
                 mlp_ratio: float = 4.0,
                 qkv_bias: bool = True,
                 drop_path_rate: float = 0.1,
                 norm_cfg: dict = dict(type='LN', eps=1e-6),
                 act_cfg: dict = dict(type='GELU'),
                 use_abs_pos: bool = True,
                 use_rel_pos: bool = True,
                 rel_pos_zero_init: bool = True,
                 window_size: int = 14,
                 window_block_indexes: Sequence[int] = (0, 1, 3, 4, 6, 7, 9, 10),
                 pretrain_img_size: int = 224,
                 pretrain_use_cls_token: bool = True,
                 with_cp: bool = False,
                 init_cfg: Optional[dict] = None):
        super().__init__(init_cfg=init_cfg)
        if init_cfg is not None and not (isinstance(init_cfg, dict) and init_cfg.get('type') == 'Pretrained'
                                         and 'checkpoint' in init_cfg):
            raise ValueError(f'{type(self).__name__}: init_cfg must be None or '
                             f"dict(type='Pretrained', checkpoint=...), got {init_cfg!r}")
        self.pretrain_use_cls_token = pretrain_use_cls_token
        self.with_cp = with_cp
        self.patch_embed = ViTDetPatchEmbed(patch_size, in_chans, embed_dim)
        if use_abs_pos:
            num_positions = (pretrain_img_size // patch_size)**2 + int(pretrain_use_cls_token)
            self.pos_embed = nn.Parameter(torch.zeros(1, num_positions, embed_dim))
            nn.init.trunc_normal_(self.pos_embed, std=0.02)
        else:
            self.pos_embed = None
        drop_path_rates = torch.linspace(0, drop_path_rate, depth).tolist()
        self.blocks = nn.ModuleList([
            ViTDetBlock(
                embed_dim,
                num_heads,
                mlp_ratio=mlp_ratio,
                qkv_bias=qkv_bias,
                drop_path=drop_path_rates[i],
                norm_cfg=norm_cfg,
                act_cfg=act_cfg,
                use_rel_pos=use_rel_pos,
                rel_pos_zero_init=rel_pos_zero_init,
                window_size=window_size if i in window_block_indexes else 0,
                input_size=(img_size // patch_size, img_size // patch_size)) for i in range(depth)
        ])

    def add_abs_pos_embed(self, x: torch.Tensor) -> torch.Tensor:
        """Add the absolute position embedding, resized to the (B, H, W, C) grid ``x``."""
        if self.pos_embed is None:
            return x
        pos_embed = self.pos_embed[:, 1:] if self.pretrain_use_cls_token else self.pos_embed
        size = math.isqrt(pos_embed.shape[1])
        pos_embed = pos_embed.reshape(1, size, size, -1)
        if (size, size) != (x.shape[1], x.shape[2]):
            pos_embed = F.interpolate(pos_embed.permute(0, 3, 1, 2), size=(x.shape[1], x.shape[2]),
                                      mode='bicubic', align_corners=False).permute(0, 2, 3, 1)
        return x + pos_embed

    def forward_blocks(self, x: torch.Tensor) -> torch.Tensor:
        """Run the blocks on the (B, H, W, C) grid; return the (B, C, H, W) feature map."""
        for block in self.blocks:
            if self.with_cp and x.requires_grad:
                x = cp.checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        return x.permute(0, 3, 1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_blocks(self.add_abs_pos_embed(self.patch_embed(x)))

    @staticmethod
    def _vitdet_init(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.trunc_normal_(module.weight, std=0.02)
            if module.bias is not None:
                nn.init.constant_(module.bias, 0)
        elif isinstance(module, nn.LayerNorm):
            nn.init.constant_(module.weight, 1.0)
            nn.init.constant_(module.bias, 0)

    def init_weights(self) -> None:
        logger = MMLogger.get_current_instance()
        if self.init_cfg is None:
            logger.warning(f'{type(self).__name__}: no pretrained weights (init_cfg=None), training '
                           'starts from scratch')
            self.apply(self._vitdet_init)
            return
        with weights_only_loading():  # never the pickle of a URL's file, opted in to condtok_mm.compat or not
            checkpoint = CheckpointLoader.load_checkpoint(self.init_cfg['checkpoint'], map_location='cpu',
                                                          logger=logger)
        state_dict = checkpoint.get('model', checkpoint.get('state_dict', checkpoint))
        result = self.load_state_dict(state_dict, strict=False)
        # An MAE checkpoint has no relative position embeddings (they keep their zero start) and has keys
        # ViTDet drops; anything else that does not match is worth a warning.
        unused = [k for k in result.unexpected_keys if not k.startswith(MAE_ONLY_KEY_PREFIXES)]
        missing = [k for k in result.missing_keys if not k.endswith(('rel_pos_h', 'rel_pos_w'))]
        logger.info(f'{type(self).__name__}: loaded {self.init_cfg["checkpoint"]}; not in it (keep their '
                    f'initialization): {result.missing_keys}; in it but not used: {result.unexpected_keys}')
        if unused or missing:
            logger.warning(f'{type(self).__name__}: the checkpoint does not match the model: missing '
                           f'{missing}, unexpected {unused}')
