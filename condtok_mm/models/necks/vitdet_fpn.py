"""ViTDetFPN: ViTDet's simple feature pyramid, built from the last feature map of a plain ViT.

mmdet 3.3.0 carries it as ``SimpleFPN`` (with its 2-D LayerNorm ``LN2d``) in projects/ViTDet, which the pip
wheel does not ship; this is our own implementation under names that cannot clash with it, with the same
parameters and state-dict keys, so ViTDet detector checkpoints load.
"""
from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmcv.cnn import ConvModule, build_norm_layer
from mmengine.model import BaseModule

from condtok_mm.models.weights_only_init import WeightsOnlyInit
from condtok_mm.registry import MODELS


@MODELS.register_module()
class ViTDetLN2d(nn.Module):
    """LayerNorm over the channels of a (B, C, H, W) map, at every position (ViTDet's ``LN2d``).

    A plain nn.Module, not an nn.LayerNorm subclass, so that mmcv names it 'norm_layer' inside a
    ConvModule, as it names mmdet's LN2d: the state-dict keys of the convs stay those of ViTDet.

    Args:
        normalized_shape (int): channels C.
        eps (float): added to the variance. Default: 1e-6 (built from a config through mmcv's
            build_norm_layer, as in the neck and heads, it is mmcv's default 1e-5 unless the config sets
            eps; the same holds for mmdet's LN2d).
    """

    def __init__(self, normalized_shape: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(normalized_shape))
        self.bias = nn.Parameter(torch.zeros(normalized_shape))
        self.eps = eps
        self.normalized_shape = (normalized_shape, )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x.permute(0, 2, 3, 1), self.normalized_shape, self.weight, self.bias,
                            self.eps).permute(0, 3, 1, 2)


@MODELS.register_module()
class ViTDetFPN(WeightsOnlyInit, BaseModule):
    """Simple feature pyramid of ViTDet: strides 4, 8, 16, 32 and 64 from one stride-16 map.

    From the backbone's map (B, C, H, W): two 2x2 transposed convolutions (with norm and GELU between)
    give stride 4 with C/4 channels, one gives stride 8 with C/2, the map itself is stride 16, a 2x2 max
    pool gives stride 32; each level then has a 1x1 lateral and a 3x3 output ConvModule to
    ``out_channels``, and levels beyond the fourth subsample the last one by 2 (stride 64 for
    ``num_outs=5``). Unlike an FPN there is no top-down path.

    Args:
        backbone_channel (int): channels C of the backbone map.
        in_channels (Sequence[int]): channels of the four branches, which must be
            [C/4, C/2, C, C], e.g. [192, 384, 768, 768] for ViT-B.
        out_channels (int): channels of every output level.
        num_outs (int): output levels, >= 4. Default: 5.
        conv_cfg (dict, optional): the ConvModules' convolutions. Default: None (Conv2d).
        norm_cfg (dict): the norms of the stride-4 branch and of the ConvModules.
            Default: ``dict(type='ViTDetLN2d')``.
        act_cfg (dict, optional): the ConvModules' activation. Default: None (ViTDet has none).
        init_cfg (dict or list[dict], optional): initialization config. Default: None.
    """

    def __init__(self,
                 backbone_channel: int,
                 in_channels: Sequence[int],
                 out_channels: int,
                 num_outs: int = 5,
                 conv_cfg: Optional[dict] = None,
                 norm_cfg: dict = dict(type='ViTDetLN2d'),
                 act_cfg: Optional[dict] = None,
                 init_cfg=None):
        super().__init__(init_cfg=init_cfg)
        branch_channels = [backbone_channel // 4, backbone_channel // 2, backbone_channel, backbone_channel]
        if list(in_channels) != branch_channels:
            raise ValueError(f'ViTDetFPN: in_channels={list(in_channels)} must be the channels of its four '
                             f'branches from a {backbone_channel}-channel map: {branch_channels}')
        if num_outs < len(branch_channels):
            raise ValueError(f'ViTDetFPN: num_outs={num_outs} must be >= 4')
        self.backbone_channel = backbone_channel
        self.in_channels = list(in_channels)
        self.out_channels = out_channels
        self.num_outs = num_outs
        # The branch names and Sequential indices are ViTDet's, so that its checkpoints load.
        self.fpn1 = nn.Sequential(  # stride 4
            nn.ConvTranspose2d(backbone_channel, backbone_channel // 2, 2, 2),
            build_norm_layer(norm_cfg, backbone_channel // 2)[1],
            nn.GELU(),
            nn.ConvTranspose2d(backbone_channel // 2, backbone_channel // 4, 2, 2))
        self.fpn2 = nn.Sequential(nn.ConvTranspose2d(backbone_channel, backbone_channel // 2, 2, 2))  # 8
        self.fpn3 = nn.Sequential(nn.Identity())  # stride 16
        self.fpn4 = nn.Sequential(nn.MaxPool2d(kernel_size=2, stride=2))  # stride 32
        self.lateral_convs = nn.ModuleList()
        self.fpn_convs = nn.ModuleList()
        for channels in self.in_channels:
            self.lateral_convs.append(
                ConvModule(channels, out_channels, 1, conv_cfg=conv_cfg, norm_cfg=norm_cfg,
                           act_cfg=act_cfg, inplace=False))
            self.fpn_convs.append(
                ConvModule(out_channels, out_channels, 3, padding=1, conv_cfg=conv_cfg,
                           norm_cfg=norm_cfg, act_cfg=act_cfg, inplace=False))

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        """(B, C, H, W) -> ``num_outs`` maps (B, out_channels, H*4/2**i, W*4/2**i)."""
        branches = [self.fpn1(x), self.fpn2(x), self.fpn3(x), self.fpn4(x)]
        outs: List[torch.Tensor] = [
            fpn_conv(lateral_conv(branch))
            for branch, lateral_conv, fpn_conv in zip(branches, self.lateral_convs, self.fpn_convs)
        ]
        while len(outs) < self.num_outs:
            outs.append(F.max_pool2d(outs[-1], 1, stride=2))
        return tuple(outs)
