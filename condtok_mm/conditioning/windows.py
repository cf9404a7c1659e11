"""Attention windows of a token grid: the runs of equal windows (Swin's shifted windows in image coordinates).
The reference path conditions each run as one batch (:func:`.reference.reference_token_windows`); the batched
path gathers every window of the padded batch into one stack (:func:`.batched.window_stack`)."""
import itertools
from typing import List, Tuple

import torch


def tokens_as_grid(x: torch.Tensor, hw_shape: Tuple[int, int], where: str) -> torch.Tensor:
    """Tokens (B, H*W, d), row-major over the grid ``hw_shape`` = (H, W), as the grid (B, H, W, d); ValueError, named
    ``where``, when they do not fill it."""
    height, width = hw_shape
    batch, num_tokens, channels = x.shape
    if num_tokens != height * width:
        raise ValueError(f'{where}: {num_tokens} tokens do not fill the grid hw_shape={tuple(hw_shape)} '
                         f'({height} x {width} = {height * width})')
    return x.reshape(batch, height, width, channels)


def _window_runs(length: int, window_size: int, shift_size: int) -> List[Tuple[int, int, int]]:
    """Cut one axis of ``length`` tokens into attention windows: runs of (start, count, window length).

    The cuts lie at ``shift_size + k * window_size``. With no shift these are the windows of a window
    partition from the top-left corner; with a shift they are the groups of tokens that attend to each
    other under Swin's cyclic shift and attention mask, in image coordinates (the wrapped-around window
    of the shifted frame is split by its mask into the strip before the first cut and the strip after
    the last one). Each run is a contiguous stretch of ``count`` windows of equal length: at most a
    head (before the first cut), a body of full windows and a tail cut by the border.
    """
    runs = []
    head = min(shift_size, length)
    if head:
        runs.append((0, 1, head))
    body = (length - head) // window_size
    if body:
        runs.append((head, body, window_size))
    tail = length - head - body * window_size
    if tail:
        runs.append((head + body * window_size, 1, tail))
    return runs


def token_windows(grid: torch.Tensor, window_size: int, shift_size: int = 0):
    """Yield ``(region, windows)`` for the attention windows of a (B, H, W, d) token grid.

    ``region`` is the (top, left, rows, cols, win_h, win_w) of a run of equal windows (see
    :func:`_window_runs`) and ``windows`` their token matrices as one (B * rows * cols, win_h * win_w, d)
    batch, image-major. Windows cut by the border hold only their real tokens.
    """
    batch, height, width, channels = grid.shape
    for (top, rows, win_h), (left, cols, win_w) in itertools.product(
            _window_runs(height, window_size, shift_size), _window_runs(width, window_size, shift_size)):
        region = grid[:, top:top + rows * win_h, left:left + cols * win_w]
        windows = region.reshape(batch, rows, win_h, cols, win_w, channels).permute(0, 1, 3, 2, 4, 5)
        yield (top, left, rows, cols, win_h, win_w), windows.reshape(-1, win_h * win_w, channels)


def window_stack(grid: torch.Tensor, mask: torch.Tensor, window_size: int, shift_size: int = 0):
    """Every attention window of a (B, H, W, C) grid as one (B * nW, window_size^2, C) stack, with its token mask
    (``mask`` (B, H, W) and False where a window reaches past the border or before the first shifted cut), and the
    function that puts such a stack back into (B, H, W, C). The same windows as :func:`token_windows`, with the
    cuts at ``shift_size + k * window_size``: the grid is padded by (window_size - shift_size) % window_size at the
    top and left, then to a multiple of window_size; reshapes only, no loop over windows."""
    batch, height, width, channels = grid.shape
    lead = (window_size - shift_size) % window_size
    padded_h = -(-(height + lead) // window_size) * window_size
    padded_w = -(-(width + lead) // window_size) * window_size
    pads = (lead, padded_w - width - lead, lead, padded_h - height - lead)
    rows, cols = padded_h // window_size, padded_w // window_size

    def stack(tensor, channels):
        return tensor.reshape(batch, rows, window_size, cols, window_size, channels).permute(
            0, 1, 3, 2, 4, 5).reshape(batch * rows * cols, window_size * window_size, channels)

    windows = stack(torch.nn.functional.pad(grid, (0, 0) + pads), channels)
    windows_mask = stack(torch.nn.functional.pad(mask.to(torch.uint8), pads).unsqueeze(-1), 1).squeeze(-1).bool()

    def unstack(tensor):
        out = tensor.reshape(batch, rows, cols, window_size, window_size, tensor.shape[-1]).permute(
            0, 1, 3, 2, 4, 5).reshape(batch, padded_h, padded_w, tensor.shape[-1])
        return out[:, lead:lead + height, lead:lead + width]

    return windows, windows_mask, unstack
