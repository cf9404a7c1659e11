"""The batched path for token grids: the valid-region mask, the window stack and the centring around
:func:`.batched.condition_masked`, the status report and the constant-correction gradient."""
from typing import Optional

import torch

from .autograd import _ConstantCorrection
from .batched import condition_masked, finish, resolve_solver
from .centred import _from_channel_mean_complement, channel_mean_complement
from .diagnostics import report_status
from .options import ConditioningOptions
from .windows import window_stack


def valid_region_mask(sizes: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """(B, H, W) True on the top-left ``sizes[b]`` = (h, w) tokens of each grid, computed on sizes' device."""
    rows = torch.arange(height, device=sizes.device)
    cols = torch.arange(width, device=sizes.device)
    return (rows[None, :, None] < sizes[:, 0, None, None]) & (cols[None, None, :] < sizes[:, 1, None, None])


def condition_grids(grid: torch.Tensor, sizes: Optional[torch.Tensor], window_size: Optional[int], shift_size: int,
                    options: ConditioningOptions) -> torch.Tensor:
    """The batched path for token grids (B, H, W, d): valid region ``sizes`` (B, 2) (None: all valid), per
    attention window when ``window_size`` is given. C is a constant in backward."""
    batch, height, width, channels = grid.shape
    mode, alpha, target_kappa, epsilon = options.mode, options.alpha, options.target_kappa, options.epsilon
    with torch.no_grad():
        tokens = grid.detach()
        if sizes is None:
            mask = torch.ones(batch, height, width, dtype=torch.bool, device=grid.device)
        else:
            mask = valid_region_mask(sizes, height, width)
        if options.centred and channels < 2:  # a single channel is all channel mean: nothing to condition
            _, status = condition_masked(tokens.reshape(batch, -1, channels), mask.reshape(batch, -1), mode, 0.0,
                                         target_kappa, epsilon, 'eigh')
            out = tokens.clone()
        else:
            inner = channel_mean_complement(tokens.double()) if options.centred else tokens
            if window_size is None:
                stack, stack_mask = inner.reshape(batch, height * width, -1), mask.reshape(batch, -1)
                unstack = lambda t: t.view(batch, height, width, -1)  # noqa: E731
            else:
                stack, stack_mask, unstack = window_stack(inner, mask, window_size, shift_size)
            conditioned, status = condition_masked(stack, stack_mask, mode, alpha, target_kappa, epsilon,
                                                   resolve_solver(options.solver, mode, grid.device))
            conditioned = unstack(conditioned)
            status = status.view(batch, -1).amax(-1)
            if options.centred:
                conditioned = tokens.double() + _from_channel_mean_complement(conditioned - inner)
            out = finish(tokens, conditioned, mask)
    report_status(status, tokens, options.check, options.where)
    return _ConstantCorrection.apply(grid, out) if torch.is_grad_enabled() and grid.requires_grad else out
