"""RescaleFPN: mmdet's FPN behind a per-level rescale of same-stride plain-ViT feature maps."""
from typing import List, Sequence

import torch.nn as nn
from mmcv.cnn import build_norm_layer
from mmengine.model import BaseModule

from condtok_mm.models.weights_only_init import WeightsOnlyInit
from condtok_mm.registry import MODELS

SCALES = (4, 2, 1, 0.5)


@MODELS.register_module()
class RescaleFPN(WeightsOnlyInit, BaseModule):
    """Turn feature maps of one stride (a plain ViT/XCiT at stride 16) into a pyramid, then apply FPN.

    The multi-scale adapter of plain-transformer detectors such as XCiT's Mask R-CNN: level i is upsampled
    by ``scales[i]`` = 4 (two stride-2 transposed convolutions with a norm and GELU between them), 2 (one
    transposed convolution), kept (1) or max-pooled (0.5), giving strides 4, 8, 16 and 32 for stride-16
    inputs; mmdet's FPN (configured by ``fpn``) follows.

    Args:
        in_channels (int): channels of every input level (the backbone's embedding width).
        fpn (dict): config of the FPN after the rescale; its ``in_channels`` is filled in.
        scales (Sequence[float]): rescale factor per input level, each one of 4, 2, 1, 0.5.
            Default: (4, 2, 1, 0.5).
        norm_cfg (dict): norm between the two transposed convolutions of the 4x branch.
            Default: dict(type='SyncBN') in XCiT; here dict(type='BN') so that it runs on one CPU.
        init_cfg (dict, optional): initialization config. Default: None.
    """

    def __init__(self,
                 in_channels: int,
                 fpn: dict,
                 scales: Sequence[float] = SCALES,
                 norm_cfg: dict = dict(type='BN'),
                 init_cfg=None):
        super().__init__(init_cfg=init_cfg)
        invalid = [s for s in scales if s not in SCALES]
        if invalid:
            raise ValueError(f'RescaleFPN: scales {invalid} are not supported; valid scales are {SCALES}')
        self.rescales = nn.ModuleList(self._rescale(s, in_channels, norm_cfg) for s in scales)
        self.fpn = MODELS.build(dict(fpn, in_channels=[in_channels] * len(scales)))

    @staticmethod
    def _rescale(scale: float, channels: int, norm_cfg: dict) -> nn.Module:
        if scale == 4:
            return nn.Sequential(
                nn.ConvTranspose2d(channels, channels, kernel_size=2, stride=2),
                build_norm_layer(norm_cfg, channels)[1], nn.GELU(),
                nn.ConvTranspose2d(channels, channels, kernel_size=2, stride=2))
        if scale == 2:
            return nn.ConvTranspose2d(channels, channels, kernel_size=2, stride=2)
        if scale == 1:
            return nn.Identity()
        return nn.MaxPool2d(kernel_size=2, stride=2)

    def forward(self, inputs: Sequence) -> List:
        if len(inputs) != len(self.rescales):
            raise ValueError(f'RescaleFPN: got {len(inputs)} feature maps for {len(self.rescales)} scales; '
                             "set the backbone's out_indices to one index per scale")
        return self.fpn([rescale(x) for rescale, x in zip(self.rescales, inputs)])
