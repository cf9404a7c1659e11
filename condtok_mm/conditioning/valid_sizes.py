"""Each image's valid region (h, w) of a padded batch, checked and turned into a device tensor (B, 2), and the mask of
the tokens it covers."""
import numbers
from typing import Sequence, Tuple, Union

import torch


def _is_size(value) -> bool:
    if isinstance(value, torch.Tensor):
        return value.dim() == 0 and not value.is_floating_point() and value.dtype != torch.bool
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def valid_size_tensor(valid_shapes: Union[Sequence[Tuple[int, int]], torch.Tensor], batch: int,
                      device: torch.device, where: str) -> torch.Tensor:
    """``valid_shapes`` as an int64 tensor (B, 2) on ``device``.

    A sequence must hold one (h, w) pair of non-negative integers per image (checked here, with an error that
    names the entry). An integer tensor (B, 2) is taken as it is, without reading it (that would be a host
    sync): negative entries count as 0 (no valid token), entries beyond the grid as the grid's size.
    """
    if isinstance(valid_shapes, torch.Tensor):
        if valid_shapes.is_floating_point() or valid_shapes.is_complex() or valid_shapes.dtype == torch.bool \
                or tuple(valid_shapes.shape) != (batch, 2):
            raise ValueError(f'{where}: valid_shapes as a tensor must be integer (B, 2) = ({batch}, 2), got '
                             f'{valid_shapes.dtype} of shape {tuple(valid_shapes.shape)}')
        return valid_shapes.to(device=device, dtype=torch.int64, non_blocking=True).clamp_min(0)
    if not isinstance(valid_shapes, (list, tuple)):
        raise ValueError(f'{where}: valid_shapes={valid_shapes!r} is invalid; use one (h, w) pair of non-negative '
                         'integers per image, or an integer (B, 2) tensor (every token valid: condition_tokens, or '
                         'a conditioner called without valid_shapes)')
    if len(valid_shapes) != batch:
        raise ValueError(f'{where}: {len(valid_shapes)} valid_shapes for a batch of {batch}')
    for image, shape in enumerate(valid_shapes):
        if not (isinstance(shape, (tuple, list)) and len(shape) == 2 and all(_is_size(v) for v in shape)
                and all(int(v) >= 0 for v in shape)):
            raise ValueError(f'{where}: valid_shapes[{image}] must be a pair (h, w) of non-negative integers (the '
                             f"image's valid token rows and columns), got {shape!r}")
    sizes = torch.tensor([[int(h), int(w)] for h, w in valid_shapes], dtype=torch.int64)
    if torch.device(device).type == 'cuda':  # pinned and non-blocking: no host sync for the upload
        return sizes.pin_memory().to(device, non_blocking=True)
    return sizes.to(device)


def valid_region_mask(sizes: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """(B, H, W) True on the top-left ``sizes[b]`` = (h, w) tokens of each grid, computed on sizes' device."""
    rows = torch.arange(height, device=sizes.device)
    cols = torch.arange(width, device=sizes.device)
    return (rows[None, :, None] < sizes[:, 0, None, None]) & (cols[None, None, :] < sizes[:, 1, None, None])
