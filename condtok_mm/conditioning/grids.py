"""The batched path for token grids: the valid-region mask, the window stack and the centring around
:func:`.batched.condition_masked`, the status report and the constant-correction gradient. Its callers (the functional
API) have checked the options and the window."""
from typing import Optional

import torch

from .autograd import _ConstantCorrection
from .batched import ACCURATE_ROWS, _status, condition_masked, finish
from .centred import _from_channel_mean_complement, channel_mean_complement
from .dct_graying import dct_bases, dct_graying
from .diagnostics import report_status
from .modes import BOUNDING_MODES
from .options import ConditioningOptions
from .two_pass import condition_two_pass
from .valid_sizes import valid_region_mask
from .windows import window_stack


def condition_grids(grid: torch.Tensor, sizes: Optional[torch.Tensor], window_size: Optional[int], shift_size: int,
                    options: ConditioningOptions) -> torch.Tensor:
    """The batched path for token grids (B, H, W, d): valid region ``sizes`` (B, 2) (None: all valid), per
    attention window when ``window_size`` is given. C is a constant in backward."""
    batch, height, width, channels = grid.shape
    with torch.no_grad():
        tokens = grid.detach()
        if sizes is None:
            mask = torch.ones(batch, height, width, dtype=torch.bool, device=grid.device)
        else:
            mask = valid_region_mask(sizes, height, width)
        if options.centred and channels < 2:  # a single channel is all channel mean: nothing to condition
            flat = tokens.reshape(batch, -1, channels).masked_fill(~mask.reshape(batch, -1, 1), 0)
            status = _status(flat, torch.isfinite(flat).flatten(1).all(-1), grid.dtype)
            out = tokens.clone()
        elif _two_pass_applies(tokens, window_size, options):
            out, status = condition_two_pass(tokens.reshape(batch, height * width, channels), mask.reshape(batch, -1),
                                             options)
            out = out.view(grid.shape)
        else:
            inner = channel_mean_complement(tokens.double()) if options.centred else tokens
            if options.mode == 'graying_dct':
                conditioned, status = _condition_dct(inner, mask, sizes, options, grid.dtype)
            else:
                conditioned, status = _condition_stacks(inner, mask, window_size, shift_size, options)
            if options.centred:
                conditioned = tokens.double() + _from_channel_mean_complement(conditioned - inner)
            out = finish(tokens, conditioned, mask)
    report_status(options.flag_invalid_alpha(status), tokens, options)
    return _ConstantCorrection.apply(grid, out) if torch.is_grad_enabled() and grid.requires_grad else out


def _two_pass_applies(tokens: torch.Tensor, window_size: Optional[int], options: ConditioningOptions) -> bool:
    """Whole images of float32/16 tokens, taller than ACCURATE_ROWS x d, in a bounding mode, not centred: the
    two-pass path (:mod:`.two_pass`); a static choice, the same for any valid sizes."""
    _, height, width, channels = tokens.shape
    return (window_size is None and not options.centred and options.mode in BOUNDING_MODES
            and tokens.dtype != torch.float64 and height * width > ACCURATE_ROWS * channels)


def _condition_stacks(inner: torch.Tensor, mask: torch.Tensor, window_size: Optional[int], shift_size: int,
                      options: ConditioningOptions):
    """The grids ``inner`` (B, H, W, d) conditioned as one token matrix per valid region, or per attention window
    of it, through :func:`.batched.condition_masked`, and the status of each image."""
    batch, height, width, _ = inner.shape
    if window_size is None:
        stack, stack_mask = inner.reshape(batch, height * width, -1), mask.reshape(batch, -1)
        unstack = lambda t: t.view(batch, height, width, -1)  # noqa: E731
    else:
        stack, stack_mask, unstack = window_stack(inner, mask, window_size, shift_size)
    conditioned, status = condition_masked(stack, stack_mask, options)
    return unstack(conditioned), status.view(batch, -1).amax(-1)


def _condition_dct(inner: torch.Tensor, mask: torch.Tensor, sizes: Optional[torch.Tensor],
                   options: ConditioningOptions, dtype: torch.dtype):
    """Token Graying's DCT form (:mod:`.dct_graying`, with the alpha and epsilon of ``options``) of the grids
    ``inner`` (B, H, W, d) on their valid regions, and the status of each image. ``dtype``, the tokens' dtype,
    decides what overflows; the working precision is float64 for float64 grids (float64 tokens, or centred ones),
    float32 otherwise (the transforms are orthogonal). An image with NaN/Inf tokens comes back as it was (its status
    says so)."""
    batch, height, width, channels = inner.shape
    work = torch.float64 if inner.dtype == torch.float64 else torch.float32
    original = inner.to(work, copy=True).masked_fill_(~mask.unsqueeze(-1), 0)
    finite = torch.isfinite(original).flatten(1).all(-1)[:, None, None, None]
    x = torch.where(finite, original, torch.zeros((), dtype=work, device=original.device))
    if sizes is None:
        sizes = torch.tensor([[height, width]], device=x.device).expand(batch, 2)
    bases_h = dct_bases(sizes[:, 0].clamp(max=height), height, work)
    bases_w = dct_bases(sizes[:, 1].clamp(max=width), width, work)
    conditioned = torch.where(finite, dct_graying(x, bases_h, bases_w, options.alpha, options.epsilon), original)
    return conditioned, _status(conditioned.view(batch, -1, channels), finite.view(batch), dtype)
