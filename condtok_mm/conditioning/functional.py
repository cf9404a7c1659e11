"""The functional API: condition a batch of token matrices, the valid region of each padded grid, or each
attention window. Each function checks its tensors, takes the options as one :class:`.ConditioningOptions` (or as
keyword options, which make one), hands the work to the batched path (:mod:`.grids`) or the float64 reference
(:mod:`.reference`) and applies the token-scale control (:mod:`.token_scale`) the options name."""
from typing import Optional, Sequence, Tuple, Union

import torch

from .grids import condition_grids
from .options import ConditioningOptions
from .reference import reference_condition_grid, reference_token_windows, reference_valid_regions
from .token_scale import match_token_scale
from .valid_sizes import valid_size_tensor
from .windows import tokens_as_grid

ValidShapes = Union[Sequence[Tuple[int, int]], torch.Tensor]


def condition_tokens(x: torch.Tensor, options: Optional[ConditioningOptions] = None, **kwargs) -> torch.Tensor:
    """Return X + C for a batch of token matrices, so that kappa(X + C) <= target_kappa per sample
    (kappa(X + C) = kappa(X)^epsilon with ``mode='graying'``; ``mode='graying_dct'`` takes grids only).

    Args:
        x (Tensor): token matrices of shape (B, N, d) or (N, d), or token grids (B, H, W, d) (each the
            H*W x d matrix of its tokens, row-major); any floating dtype. The correction is computed in float64
            and the result is returned in ``x.dtype``.
        options (ConditioningOptions, optional): the options (mode, alpha, target_kappa, detach, solver, centred,
            epsilon, check, control, where; documented there). None: the defaults, named 'condition_tokens' in
            errors. Default: None.
        **kwargs: options to set on top of ``options``, e.g. ``mode='floor'``.

    Returns:
        Tensor: X + C (or its token-scale control, ``control``) with the shape and dtype of ``x``. A zero matrix is
        returned unchanged.

    Raises:
        ValueError: on NaN/Inf in ``x``, on X + C that overflows ``x.dtype`` (float16), or on invalid options.
    """
    options = ConditioningOptions.resolve(options, 'condition_tokens', kwargs)
    if x.dim() not in (2, 3, 4):
        raise ValueError(f'{options.where}: expected tokens of shape (B, N, d), (N, d) or (B, H, W, d), got '
                         f'{tuple(x.shape)}')
    if not x.is_floating_point():
        raise ValueError(f'{options.where}: expected floating-point tokens, got {x.dtype}')
    if options.mode == 'graying_dct' and x.dim() != 4:
        raise ValueError(f"{options.where}: mode='graying_dct' needs the token grid (its DCT runs along the grid's "
                         f'rows and columns): pass token grids (B, H, W, d), not {tuple(x.shape)} (to a '
                         'TokenConditioner, the grid hw_shape=(H, W))')
    grid = {2: lambda t: t[None, :, None], 3: lambda t: t[:, :, None], 4: lambda t: t}[x.dim()](x)
    if grid.numel() == 0:
        return x
    if options.on_reference_path:
        out = reference_condition_grid(grid, options.for_reference())
    else:
        out = condition_grids(grid, None, None, 0, options)
    return _controlled(grid, out, options).view(x.shape)  # one ratio per image, also of an (N, d) matrix


def condition_valid_regions(grid: torch.Tensor, valid_shapes: ValidShapes, window_size: Optional[int] = None,
                            shift_size: int = 0, options: Optional[ConditioningOptions] = None,
                            **kwargs) -> torch.Tensor:
    """Condition image b on the top-left ``valid_shapes[b]`` part of its token grid only; the other tokens
    (padding) pass unchanged.

    Args:
        grid (Tensor): token grids (B, H, W, d) of a padded batch.
        valid_shapes (Sequence[tuple[int, int]] or Tensor): per image, the (h, w) of its valid tokens:
            non-negative integers, or an integer tensor (B, 2) (on the batched path it stays on the device and
            sizes beyond the grid are clipped to it; a new set of sizes then recompiles nothing).
        window_size (int, optional): condition each attention window of the valid region on its own
            (:func:`condition_token_windows`; windows cut by the valid region keep their valid tokens, a window
            with none passes unchanged; the token-scale control stays one r per image). None: the valid region as
            one matrix. Default: None.
        shift_size (int): Swin's window shift, with ``window_size``. Default: 0.
        options, **kwargs: see :func:`condition_tokens` (errors named 'condition_valid_regions' by default).

    Returns:
        Tensor: the conditioned grids, shape and dtype of ``grid``.
    """
    options = ConditioningOptions.resolve(options, 'condition_valid_regions', kwargs)
    if grid.dim() != 4:
        raise ValueError(f'{options.where}: expected token grids (B, H, W, d), got {tuple(grid.shape)}')
    if window_size is not None:
        options.check_window(window_size, shift_size)
    sizes = valid_size_tensor(valid_shapes, grid.shape[0], grid.device, options.where)
    if options.on_reference_path:
        shapes = [tuple(size) for size in sizes.tolist()]
        out = reference_valid_regions(grid, shapes, window_size, shift_size, options.for_reference())
    else:
        out = condition_grids(grid, sizes, window_size, shift_size, options)
    return _controlled(grid, out, options, sizes)


def condition_token_windows(x: torch.Tensor, hw_shape: Tuple[int, int], window_size: int, shift_size: int = 0,
                            options: Optional[ConditioningOptions] = None, **kwargs) -> torch.Tensor:
    """Condition the token matrix of every attention window on its own: kappa <= target_kappa per window.

    The windows are those of a windowed-attention block (Swin's W-MSA/SW-MSA, ViTDet's window blocks):
    ``window_size`` x ``window_size`` tiles from the top-left corner of the (H, W) token grid, moved by
    ``shift_size`` as Swin's shifted windows are (:func:`.windows.token_windows`). The attention pads the grid to
    a multiple of the window size with zero tokens (after its LayerNorm); those are not part of any window's
    matrix here: a window cut by the border is conditioned as the matrix of its real tokens only (fewer rows).
    The batched path conditions every window of the batch in one stack (:func:`.windows.window_stack`).

    Args:
        x (Tensor): tokens of shape (B, H*W, d), row-major over the (H, W) grid.
        hw_shape (tuple[int, int]): the grid (H, W).
        window_size (int): side of the square attention window, >= 1.
        shift_size (int): Swin's window shift, 0 <= shift_size < window_size. Default: 0.
        options, **kwargs: see :func:`condition_tokens` (errors named 'condition_token_windows' by default).

    Returns:
        Tensor: the conditioned tokens, shape and dtype of ``x``.
    """
    options = ConditioningOptions.resolve(options, 'condition_token_windows', kwargs)
    options.check_window(window_size, shift_size)
    if x.dim() != 3:
        raise ValueError(f'{options.where}: expected tokens of shape (B, H*W, d), got {tuple(x.shape)}')
    grid = tokens_as_grid(x, hw_shape, options.where)
    if options.on_reference_path:
        out = reference_token_windows(x, hw_shape, window_size, shift_size, options.for_reference())
    else:
        out = condition_grids(grid, None, window_size, shift_size, options).reshape(x.shape)
    return _controlled(x, out, options)


def _controlled(x: torch.Tensor, conditioned: torch.Tensor, options: ConditioningOptions,
                sizes: Optional[torch.Tensor] = None) -> torch.Tensor:
    """X + C, or its token-scale control where ``options.control`` names one (per image; over the valid tokens of
    grids ``x`` with ``sizes`` (B, 2))."""
    if options.control is None:
        return conditioned
    return match_token_scale(x, conditioned, options.control, sizes)
