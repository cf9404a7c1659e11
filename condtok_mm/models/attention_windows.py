"""The windows of windowed attention, cut and put back as ViTDet's window blocks and mmdet's and mmpretrain's Swin
``ShiftWindowMSA`` cut them; the attention hooks cut their masks the same way. Pure PyTorch.

:func:`condtok_mm.conditioning.token_windows` cuts the conditioner's windows, which hold only a window's real tokens,
never padding.
"""
from typing import Tuple

import torch
import torch.nn.functional as F

__all__ = ['window_partition', 'window_unpartition']


def window_partition(x: torch.Tensor, window_size: int,
                     shift_size: int = 0) -> Tuple[torch.Tensor, Tuple[int, int]]:
    """Cut a (B, H, W, C) grid into (B * num_windows, window_size, window_size, C) windows, batch-major.

    As windowed attention cuts them (ViTDet's window blocks; mmdet's and mmpretrain's Swin ShiftWindowMSA):
    the grid is padded with zeros at the bottom and right to a multiple of the window size, rolled by
    -shift_size for Swin's shifted windows, then cut row-major. The padded tokens take part in the attention
    of the border windows.

    Returns:
        tuple: the windows and the padded grid size (Hp, Wp).
    """
    batch, height, width, channels = x.shape
    x = F.pad(x, (0, 0, 0, -width % window_size, 0, -height % window_size))
    padded_h, padded_w = x.shape[1], x.shape[2]
    if shift_size:
        x = torch.roll(x, shifts=(-shift_size, -shift_size), dims=(1, 2))
    windows = x.view(batch, padded_h // window_size, window_size, padded_w // window_size, window_size,
                     channels).permute(0, 1, 3, 2, 4, 5)
    return windows.reshape(-1, window_size, window_size, channels), (padded_h, padded_w)


def window_unpartition(windows: torch.Tensor, window_size: int, padded_hw: Tuple[int, int],
                       hw: Tuple[int, int]) -> torch.Tensor:
    """Inverse of :func:`window_partition` without a shift: (B * num_windows, ws, ws, C) back to (B, H, W, C),
    unpadded."""
    padded_h, padded_w = padded_hw
    rows, cols = padded_h // window_size, padded_w // window_size
    batch = windows.shape[0] // (rows * cols)
    x = windows.view(batch, rows, cols, window_size, window_size, -1).permute(0, 1, 3, 2, 4, 5)
    x = x.reshape(batch, padded_h, padded_w, -1)
    return x[:, :hw[0], :hw[1]].contiguous()
