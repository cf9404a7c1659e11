"""The float64 reference: the Gram (X^T X) path with its canonical null-space completion (solver='reference_gram') and the
thin SVD (solver='reference_svd'), one image at a time. It is the oracle the batched path is tested against, kept to
round-off (tests/conditioning/test_reference_golden.py), and the path of ``detach=False`` (the gradient through the
SVD). Every function takes the options as one :class:`.options.ConditioningOptions` with alpha a float
(:meth:`.options.ConditioningOptions.for_reference`)."""
import math
from typing import Optional, Sequence, Tuple

import torch

from .autograd import _ConstantCorrection, _correction_safe_svd
from .centred import _from_channel_mean_complement, channel_mean_complement
from .completion import (_COMPLETION_OVERSAMPLING, _add_bands, _band_sums, _bands, _canonical_null_directions,
                         _complete_null_space, _completion_lift)
from .diagnostics import _check_finite, _check_output
from .modes import _gram_scales, _lift, graying_floor
from .options import ConditioningOptions
from .windows import token_windows, tokens_as_grid

# A Gram matrix whose largest diagonal entry is below this is recomputed from rescaled tokens: its
# entries may have underflowed (float64 tokens below ~1e-100), or the sample is zero.
_GRAM_FLOOR = 1e-200


def _correction_gram_tall(x: torch.Tensor, gram: torch.Tensor, options: ConditioningOptions, add_tokens: bool = False,
                          grid_width: int = 1, s1_floor=0.0) -> Optional[torch.Tensor]:
    """C (X + C with ``add_tokens``) for float64 x (B, N, d), N >= d, from its d x d Gram matrix ``gram``.

    The product X (M - A W) (X (I + M - A W) for X + C) and, with null directions, two passes (band sums,
    band lifts). Null directions beside a non-null spectrum wider than kappa 1e3, where the single
    projection behind A would leave up to eps * kappa^2 of range(X) in the completion, are completed by
    :func:`_complete_null_space` instead. Returns None when the band candidates cannot complete the null
    space (the SVD then does the work). ``s1_floor``: graying's least s_1 (:func:`.modes.graying_floor`).
    """
    lam, v = torch.linalg.eigh(gram)  # ascending
    s, null, lift, scale, keep = _gram_scales(lam, options, s1_floor)
    has_signal = s[..., -1:] > 0
    # Summed over the non-null directions, X v_i (D_i / s_i) is X M with the d x d matrix M = V diag(D/S) V^T
    # (X (I + M) for X + C, at no extra cost).
    product = (v * (keep if add_tokens else scale).unsqueeze(-2)) @ v.transpose(-1, -2)
    null_count = null.sum(-1)
    k = int(null_count.max())
    if k == 0:
        return x @ product
    inv_s2 = torch.where(null | ~has_signal, torch.zeros_like(s), 1 / lam.clamp_min(1e-300))
    bands = _bands(x.shape[-2], min(x.shape[-2], k + _COMPLETION_OVERSAMPLING), grid_width)
    lift_null = (lift * null)[..., :k]
    if bool((lam[..., -1] * inv_s2.amax(-1) > 1e6).any()):
        completion = _complete_null_space(x, bands, v, inv_s2, null_count, k)
        v_c = _canonical_null_directions(v, null_count, k)
        if completion is None or v_c is None:
            return None
        # Null direction j (j < k_b) of sample b: canonical completion vector j times D_j times canonical v_j^T.
        return torch.baddbmm(x @ product, completion, lift_null.unsqueeze(-1) * v_c.transpose(-1, -2))
    completion = _completion_lift(_band_sums(x, bands), v, inv_s2, lift_null, null_count)
    if completion is None:
        return None
    a, lift_w = completion
    result = x @ (product - a @ lift_w)
    _add_bands(result, lift_w, bands)
    return result


# Rows of the token grid processed at a time by the streaming Gram path: about 8k tokens, so that the float64
# copy of a chunk (6 MB at d = 96) is reused from cache instead of allocating the N x d float64 matrix.
_CHUNK_TOKENS = 8192


def _conditioned_grid_streaming(grid: torch.Tensor, out: torch.Tensor, options: ConditioningOptions,
                                s1_floor: float = 0.0) -> bool:
    """Write X + C into ``out`` for the token grids ``grid`` (B, H, W, d), H * W >= d, reading X twice.

    The Gram path with nothing else materialized: pass 1 casts chunks of rows to float64 and accumulates
    G = X^T X; with null directions, a reduction sums each band's tokens (the band candidates are runs of
    whole grid rows, :func:`_bands`); pass 2 casts the chunks again and writes X (I + M - A W) plus the band
    lifts Z W, cast to ``out``'s dtype, into ``out`` (B, H, W, d; any strides, e.g. the valid part of a
    padded batch). Returns False, having written nothing, where the explicit path must do the work:
    non-finite or extreme tokens, fewer grid rows than bands, or a completion this shortcut cannot make
    accurately. ``s1_floor``: graying's least s_1 (:func:`.modes.graying_floor`).
    """
    batch, height, width, d = (int(size) for size in grid.shape)  # tensors while torch.jit.trace records
    rows = max(1, _CHUNK_TOKENS // width)
    chunks = [(r, min(height, r + rows)) for r in range(0, height, rows)]
    buffer = torch.empty(batch, min(rows, height), width, d, dtype=torch.float64, device=grid.device)
    gram = torch.zeros(batch, d, d, dtype=torch.float64, device=grid.device)
    for start, end in chunks:
        chunk = buffer[:, :end - start]
        chunk.copy_(grid[:, start:end])
        tokens = chunk.view(batch, -1, d)
        gram += tokens.transpose(-1, -2) @ tokens
    largest = gram.diagonal(dim1=-2, dim2=-1).amax(-1)
    if not bool(torch.isfinite(gram).all() & (largest >= _GRAM_FLOOR).all()):
        return False
    lam, v = torch.linalg.eigh(gram)  # ascending
    s, null, lift, scale, keep = _gram_scales(lam, options, s1_floor)  # s_1 > 0
    product = (v * keep.unsqueeze(-2)) @ v.transpose(-1, -2)  # I + M
    null_count = null.sum(-1)
    k = int(null_count.max())
    bands = []
    if k:
        inv_s2 = torch.where(null, torch.zeros_like(s), 1 / lam.clamp_min(1e-300))
        m = k + _COMPLETION_OVERSAMPLING
        if m > height or bool((lam[..., -1] * inv_s2.amax(-1) > 1e6).any()):
            return False
        bands = [(start // width, end // width) for start, end in _bands(height * width, m, width)]  # grid rows
        norms = [math.sqrt((end - start) * width) for start, end in bands]
        x_z = torch.stack([grid[:, start:end].sum(dim=(1, 2), dtype=torch.float64) / norm
                           for (start, end), norm in zip(bands, norms)], dim=-1)
        completion = _completion_lift(x_z, v, inv_s2, (lift * null)[..., :k], null_count)
        if completion is None:
            return False
        a, lift_w = completion
        product = product - a @ lift_w
        # Z W: every token of band j gets W_j / sqrt(tokens in band j).
        bands = [(start, end, (lift_w[:, j] / norm)[:, None, None]) for j, ((start, end), norm)
                 in enumerate(zip(bands, norms))]
    for start, end in chunks:
        chunk = buffer[:, :end - start]
        chunk.copy_(grid[:, start:end])
        conditioned = (chunk.view(batch, -1, d) @ product).view(chunk.shape)
        if not bands:
            out[:, start:end].copy_(conditioned)
        for band_start, band_end, band_lift in bands:  # the bands this chunk of rows meets
            low, high = max(start, band_start), min(end, band_end)
            if low < high:
                torch.add(conditioned[:, low - start:high - start], band_lift, out=out[:, low:high])
    return True


def _correction_svd(x: torch.Tensor, options: ConditioningOptions, s1_floor=0.0) -> torch.Tensor:
    """Reference C from the thin SVD (LAPACK completes U and V over null directions).

    That completion pairs whatever null-space bases the SVD returns, so over null directions this path is
    not canonical (it can differ between devices and libraries); the Gram path's completion is. ``s1_floor``:
    graying's least s_1 (:func:`.modes.graying_floor`).
    """
    u, s, vh = torch.linalg.svd(x, full_matrices=False)
    s1 = s[..., :1]
    return (u * _lift(s, s1, options, s1_floor).unsqueeze(-2)) @ vh


def token_correction(x: torch.Tensor, options: Optional[ConditioningOptions] = None, add_tokens: bool = False,
                     grid_width: int = 1, s1_floor: float = 0.0, **kwargs) -> torch.Tensor:
    """The float64 reference's correction C for float64 token matrices ``x`` of shape (B, N, d).

    Args:
        x (Tensor): float64 token matrices (B, N, d).
        options (ConditioningOptions, optional): the options (the mode, alpha, target_kappa, centred, epsilon and
            solver: 'auto' or 'reference_gram' for the Gram path, 'reference_svd' for the SVD; C is computed
            without a gradient of its own). None: the defaults, named 'token_correction' in errors. Default: None.
        add_tokens (bool): return X + C instead, computed without a separate pass to add X. Default: False.
        grid_width (int): the width of the token grid the N rows come from (row-major), which places the null-space
            completion on bands of whole grid rows. Default: 1.
        s1_floor (float): graying's least s_1 in x's units (:func:`.modes.graying_floor` of the tokens' dtype).
            Default: 0.0.
        **kwargs: options to set on top of ``options``, e.g. ``mode='floor'``.

    Raises:
        ValueError: naming ``where`` on NaN/Inf in ``x``, or on invalid options (a batched solver, a token-scale
            control, which applies to X + C and not to C, or check=False).
    """
    options = ConditioningOptions.resolve(options, 'token_correction', kwargs).for_reference(applies_control=False)
    return _correction(x, options, add_tokens, grid_width, s1_floor)


def _correction(x: torch.Tensor, options: ConditioningOptions, add_tokens: bool = False, grid_width: int = 1,
                s1_floor: float = 0.0) -> torch.Tensor:
    """:func:`token_correction` for options as the reference takes them (checked)."""
    where, alpha = options.where, options.alpha
    if options.centred:
        if x.shape[-1] < 2:  # no complement to condition: a single channel is all channel mean
            _check_finite(x, where)
            return x.clone() if add_tokens else torch.zeros_like(x)
        correction = _from_channel_mean_complement(
            _correction(channel_mean_complement(x), options.replace(centred=False), s1_floor=s1_floor))
        return x + correction if add_tokens else correction
    if alpha == 0:
        _check_finite(x, where)
        return x.clone() if add_tokens else torch.zeros_like(x)
    gram_path = options.solver != 'reference_svd'
    wide = x.shape[-2] < x.shape[-1]
    tall = x.transpose(-1, -2) if wide else x  # kappa and the construction are the same for X^T
    correction = None
    if gram_path:
        gram = tall.transpose(-1, -2) @ tall
        # Squares of float32/16 values neither overflow nor underflow in float64, so the Gram matrix of
        # the tokens themselves is usable; NaN/Inf in x always reach its diagonal. Only float64 tokens of
        # extreme magnitude (or all-zero ones) take the rescaled path below.
        largest = gram.diagonal(dim1=-2, dim2=-1).amax(-1)
        if bool(torch.isfinite(gram).all() & (largest >= _GRAM_FLOOR).all()):
            correction = _correction_gram_tall(tall, gram, options, add_tokens, 1 if wide else grid_width, s1_floor)
            if correction is not None:
                return correction.transpose(-1, -2) if wide else correction
    _check_finite(x, where)
    # Scale each sample to max |x| = 1 so that the Gram matrix neither overflows nor underflows;
    # C is homogeneous of degree 1 in X, so it is scaled back afterwards (graying's is not: see below).
    amax = tall.abs().amax(dim=(-2, -1), keepdim=True)
    unit = tall / torch.where(amax > 0, amax, torch.ones_like(amax))
    # graying's least s_1 in the units of X / amax, one per sample (B, 1)
    unit_floor = (s1_floor / torch.where(amax > 0, amax, torch.ones_like(amax))).squeeze(-1) if s1_floor else 0.0
    if gram_path:
        correction = _correction_gram_tall(unit, unit.transpose(-1, -2) @ unit, options,
                                           grid_width=1 if wide else grid_width, s1_floor=unit_floor)
    if correction is None:  # solver='reference_svd', or the Gram path's completion had no room to work
        correction = _correction_svd(unit, options, unit_floor)
    if options.mode == 'graying':
        # X + C = (1 - alpha) X + alpha U (S / s_1)^eps V^T, whose second term is the same for X and for X / amax;
        # formed without X + (C - X), which would cancel the O(1) result away at large amax.
        conditioned = correction + unit + (1 - alpha) * (tall - unit)
        correction = conditioned if add_tokens else conditioned - tall
    else:
        correction = correction * amax
        if add_tokens:
            correction = correction + tall
    return correction.transpose(-1, -2) if wide else correction


def reference_condition_grid(grid: torch.Tensor, options: ConditioningOptions) -> torch.Tensor:
    """X + C for token grids (B, H, W, d) on the float64 reference, one image at a time (checked ``options``;
    :func:`condtok_mm.conditioning.condition_tokens` documents them)."""
    where = options.where
    if options.detach or not torch.is_grad_enabled() or not grid.requires_grad:
        out = torch.empty(grid.shape, dtype=grid.dtype, device=grid.device)
        with torch.no_grad():
            _write_conditioned(grid.detach(), out, options)
        _check_output(out, where)
        if torch.is_grad_enabled() and grid.requires_grad:
            out = _ConstantCorrection.apply(grid, out)
        return out
    batch, height, width, d = grid.shape
    _check_finite(grid, where)
    flat = grid.reshape(batch, height * width, d)
    out = (flat + _DifferentiableCorrection.apply(flat, options, width)).view(grid.shape)
    _check_output(out, where)
    return out


def write_conditioned(grid: torch.Tensor, out: torch.Tensor, options: Optional[ConditioningOptions] = None,
                      **kwargs) -> None:
    """Write the float64 reference's X + C for the token grids ``grid`` (B, H, W, d) into ``out`` (same shape, any
    dtype and strides).

    The work of :func:`condition_tokens` on the reference (C a constant, no autograd) without allocating the
    result, so that a caller can condition part of a tensor in place, e.g. the valid region of an image in
    a padded batch. Cheap Gram cases stream over X twice (:func:`_conditioned_grid_streaming`); the others
    take the explicit path on a float64 copy.

    Args:
        grid (Tensor): token grids (B, H, W, d).
        out (Tensor): where X + C is written, the shape of ``grid``.
        options (ConditioningOptions, optional): as for :func:`token_correction` (errors named 'write_conditioned'
            by default). Default: None.
        **kwargs: options to set on top of ``options``.
    """
    options = ConditioningOptions.resolve(options, 'write_conditioned', kwargs).for_reference(applies_control=False)
    _write_conditioned(grid, out, options)


def _write_conditioned(grid: torch.Tensor, out: torch.Tensor, options: ConditioningOptions) -> None:
    """:func:`write_conditioned` for options as the reference takes them (checked)."""
    batch, height, width, d = grid.shape
    s1_floor = graying_floor(grid.dtype)
    if options.solver != 'reference_svd' and not options.centred and options.alpha != 0 and height * width >= d \
            and _conditioned_grid_streaming(grid, out, options, s1_floor):
        return
    flat = grid.reshape(batch, height * width, d).double()
    conditioned = _correction(flat, options, add_tokens=True, grid_width=width, s1_floor=s1_floor)
    out.copy_(conditioned.view(grid.shape))


def reference_valid_regions(grid: torch.Tensor, valid_shapes: Sequence[Tuple[int, int]], window_size: Optional[int],
                            shift_size: int, options: ConditioningOptions) -> torch.Tensor:
    """Condition image b on the top-left ``valid_shapes[b]`` part of its token grid only; the other tokens
    (padding) pass unchanged.

    Args:
        grid (Tensor): token grids (B, H, W, d) of a padded batch.
        valid_shapes (Sequence[tuple[int, int]]): per image, the (h, w) of its valid tokens.
        window_size (int, optional): condition each attention window of the valid region on its own
            (:func:`condition_token_windows`; windows cut by the valid region keep their valid tokens).
            None: the valid region as one matrix. Default: None.
        shift_size (int): Swin's window shift, with ``window_size``.
        options (ConditioningOptions): checked, as the reference takes them.

    Returns:
        Tensor: the conditioned grids, shape and dtype of ``grid``.
    """
    batch, height, width, channels = grid.shape
    regions = [(image, min(h, height), min(w, width)) for image, (h, w) in enumerate(valid_shapes)]
    if window_size is None and (options.detach or not torch.is_grad_enabled() or not grid.requires_grad):
        out = torch.empty(grid.shape, dtype=grid.dtype, device=grid.device)
        with torch.no_grad():
            for image, h, w in regions:  # padding copied as it is, the valid region conditioned in place
                out[image, h:] = grid[image, h:]
                out[image, :h, w:] = grid[image, :h, w:]
                if h and w:
                    _write_conditioned(grid[image:image + 1, :h, :w].detach(), out[image:image + 1, :h, :w],
                                       options)
        _check_output(out, options.where)
        return _ConstantCorrection.apply(grid, out) if torch.is_grad_enabled() and grid.requires_grad else out
    out = grid.clone(memory_format=torch.contiguous_format)
    for image, h, w in regions:
        if not (h and w):
            continue
        valid = grid[image:image + 1, :h, :w]
        if window_size is None:
            conditioned = reference_condition_grid(valid, options)
        else:
            conditioned = reference_token_windows(valid.reshape(1, h * w, channels), (h, w), window_size,
                                                  shift_size, options).view(1, h, w, channels)
        out[image:image + 1, :h, :w] = conditioned
    return out


def reference_token_windows(x: torch.Tensor, hw_shape: Tuple[int, int], window_size: int, shift_size: int,
                            options: ConditioningOptions) -> torch.Tensor:
    """Condition the token matrix of every attention window on its own: kappa <= target_kappa per window.

    The windows are those of a windowed-attention block (Swin's W-MSA/SW-MSA, ViTDet's window blocks):
    ``window_size`` x ``window_size`` tiles from the top-left corner of the (H, W) token grid, moved by
    ``shift_size`` as Swin's shifted windows are (see :func:`_window_runs`). The attention pads the grid
    to a multiple of the window size with zero tokens (after its LayerNorm); those padded tokens are not
    part of any window's matrix here: a window cut by the border is conditioned as the matrix of its
    real tokens only (fewer rows), and conditioning the padding would be undone anyway, since the
    attention pads again with zeros. A window of n tokens is an n x d matrix.

    All windows of one shape, across the whole batch, are conditioned by one batched
    :func:`condition_tokens` call: one call when the grid is a multiple of the window size, at most four
    (interior, right border, bottom border, corner) otherwise, at most nine with a shift.

    Args:
        x (Tensor): tokens of shape (B, H*W, d), row-major over the (H, W) grid.
        hw_shape (tuple[int, int]): the grid (H, W).
        window_size (int): side of the square attention window, >= 1.
        shift_size (int): Swin's window shift, 0 <= shift_size < window_size.
        options (ConditioningOptions): checked, as the reference takes them (its ``where`` names errors).

    Returns:
        Tensor: the conditioned tokens, shape and dtype of ``x``.
    """
    grid = tokens_as_grid(x, hw_shape, options.where)
    batch, num_tokens, channels = x.shape
    out = grid.new_empty(grid.shape)
    for (top, left, rows, cols, win_h, win_w), windows in token_windows(grid, window_size, shift_size):
        conditioned = reference_condition_grid(windows[:, :, None], options)
        out[:, top:top + rows * win_h, left:left + cols * win_w] = conditioned.view(
            batch, rows, cols, win_h, win_w, channels).permute(0, 1, 3, 2, 4, 5).reshape(
                batch, rows * win_h, cols * win_w, channels)
    return out.view(batch, num_tokens, channels)


class _DifferentiableCorrection(torch.autograd.Function):
    """C(X) with a gradient that stays finite at rank-deficient and repeated-spectrum inputs.

    Forward uses :func:`token_correction`. Backward differentiates C = U D(s) V^T through the thin SVD
    with the standard formulas, dropping the terms whose denominators (s_i^2 - s_j^2, s_i) vanish
    below a relative threshold; for a well-separated full-rank spectrum it is the exact derivative.
    """

    @staticmethod
    def forward(ctx, x, options, grid_width):
        x64 = x.detach().double()
        ctx.save_for_backward(x64)
        ctx.options, ctx.s1_floor = options, graying_floor(x.dtype)
        return _correction(x64, options, grid_width=grid_width, s1_floor=ctx.s1_floor).to(x.dtype)

    @staticmethod
    def backward(ctx, grad_c):
        (x64,) = ctx.saved_tensors
        options, s1_floor = ctx.options, ctx.s1_floor
        with torch.enable_grad():
            xr = x64.detach().requires_grad_(True)
            if options.centred and xr.shape[-1] < 2:
                return torch.zeros_like(grad_c), None, None
            correction = (_from_channel_mean_complement(
                _correction_safe_svd(channel_mean_complement(xr), options, s1_floor))
                if options.centred else _correction_safe_svd(xr, options, s1_floor))
            (grad_x,) = torch.autograd.grad(correction, xr, grad_c.double())
        return grad_x.to(grad_c.dtype), None, None
