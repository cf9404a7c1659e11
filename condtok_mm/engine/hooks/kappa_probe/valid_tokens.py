"""Which tokens of a padded batch are valid (the image, not its padding): per image, and per attention window."""
from typing import List, Optional, Sequence, Tuple

import torch

from condtok_mm.models.attention_windows import window_partition
from condtok_mm.models.valid_region import batch_valid_region, valid_token_shapes


def batch_valid_shapes(batch: int, hw_shape: Tuple[int, int]) -> Optional[List[Tuple[int, int]]]:
    """Each image's valid token grid in a (H, W) token grid of the live batch of ``batch`` images that
    ValidRegionDetDataPreprocessor recorded; None when every token is valid."""
    return valid_token_shapes(batch_valid_region(batch_size=batch), hw_shape)


def image_token_matrices(tokens: torch.Tensor, hw_shape: Optional[Tuple[int, int]],
                         valid_shapes: Optional[Sequence[Tuple[int, int]]]) -> List[Tuple[tuple, torch.Tensor]]:
    """Each image's (h*w, C) matrix of valid tokens, grouped into (b, h*w, C) batches of equal valid grid
    (h, w): a list of ((h, w), batch); the grid is ``hw_shape`` (possibly None) when every token is valid."""
    if valid_shapes is None or hw_shape is None:
        return [(hw_shape, tokens)]
    grid = tokens.reshape(tokens.shape[0], *hw_shape, tokens.shape[-1])
    groups = {}
    for image, shape in enumerate(valid_shapes):
        groups.setdefault(tuple(shape), []).append(image)
    return [((h, w), grid[images, :h, :w].reshape(len(images), h * w, grid.shape[-1]))
            for (h, w), images in groups.items() if h > 0 and w > 0]


def valid_token_mask(batch: int, hw_shape: Tuple[int, int],
                     valid_shapes: Optional[Sequence[Tuple[int, int]]]) -> torch.Tensor:
    """(B, H, W) bool: True on each image's valid (unpadded) tokens, the top-left ``valid_shapes[b]``."""
    mask = torch.ones(batch, *hw_shape, dtype=torch.bool)
    if valid_shapes is not None:
        mask.zero_()
        for image, (h, w) in enumerate(valid_shapes):
            mask[image, :h, :w] = True
    return mask


def window_token_mask(mask: torch.Tensor, window_size: int, shift_size: int = 0) -> torch.Tensor:
    """The validity of every token of every attention window, as the windowed attention lays them out.

    ``mask`` (B, H, W) is cut by :func:`condtok_mm.models.attention_windows.window_partition` (padded with False to a
    multiple of the window size, rolled by -shift_size for Swin's shifted windows): (B * num_windows,
    window_size ** 2).
    """
    windows, _ = window_partition(mask[..., None], window_size, shift_size)
    return windows.reshape(-1, window_size * window_size)
