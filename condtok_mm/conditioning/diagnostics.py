"""Diagnostics: kappa of token matrices, and the errors for non-finite tokens going in or coming out.

The batched path decides finiteness with tensor ops and returns one status per token matrix (``FINE``,
``BAD_INPUT``, ``BAD_OUTPUT``, and ``BAD_ALPHA`` for a tensor alpha out of its range at the call);
:func:`report_status` turns it into an error. Reading the status is a host
read, so where it happens is a choice (the ``check`` option): at once (``True``; the CPU default, where a read
costs nothing), never (``False``), or, on CUDA with ``'auto'``, deferred: the status is copied to pinned host
memory without a sync, and the error is raised by the first later call that finds the copy done (or by
:func:`raise_deferred_non_finite`, e.g. at a point where the training step syncs anyway). A compiled graph or a
CUDA-graph capture cannot raise from data: there ``'auto'`` checks nothing (use ``check=True`` to debug eager).
"""
import math
from collections import deque
from typing import Deque, Tuple

import torch

# BAD_ALPHA (a tensor alpha out of its range at the call) is the largest: a status's maximum reports it first
FINE, BAD_INPUT, BAD_OUTPUT, BAD_ALPHA = 0, 1, 2, 3


def _check_finite(x: torch.Tensor, where: str) -> None:
    if not bool(torch.isfinite(x).all()):
        raise ValueError(_input_message(where, int((~torch.isfinite(x)).sum()), x.numel()))


def _input_message(where: str, bad=None, total=None) -> str:
    count = f'has {bad} non-finite (NaN/Inf) values out of {total}' if bad is not None else \
        'has non-finite (NaN/Inf) values (found on CUDA, read back after the call that met them)'
    return (f'{where}: the token matrix {count} before conditioning; they come from the layers before it '
            '(patch embedding, input or a diverged training step), not from the conditioning. Lower the '
            'learning rate or check the input.')


def _output_message(where: str, dtype: torch.dtype) -> str:
    info = torch.finfo(dtype)
    half = ('float16 (half precision) holds values up to 65504 only: condition bfloat16 or float32 tokens '
            '(e.g. autocast(dtype=torch.bfloat16)), or lower alpha' if dtype == torch.float16 else
            f'{dtype} holds values up to {info.max:.3g}: use a wider dtype or lower alpha')
    return (f'{where}: the conditioned tokens X + C are not finite although the tokens X are: X + C (computed in '
            f'float64) overflows the tokens\' dtype when cast back; {half}.')


def _check_output(out: torch.Tensor, where: str) -> None:
    """The reference path's check that X + C, cast back to the tokens' dtype, is finite."""
    if out.numel() and not bool(torch.isfinite(out).all()):
        raise ValueError(_output_message(where, out.dtype))


class _DeferredStatus:
    """Statuses copied to pinned host memory without a sync, read once the copy is done."""

    def __init__(self):
        self.pending: Deque[Tuple[torch.Tensor, torch.cuda.Event, object, torch.dtype]] = deque()

    def push(self, status: torch.Tensor, options, dtype: torch.dtype) -> None:
        host = torch.empty((), dtype=status.dtype, pin_memory=True)
        host.copy_(status.amax(), non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        self.pending.append((host, done, options, dtype))

    def raise_ready(self, wait: bool = False) -> None:
        while self.pending and (wait or self.pending[0][1].query()):
            host, done, options, dtype = self.pending.popleft()
            done.synchronize()
            _raise_for_code(int(host), options, dtype, None)


_DEFERRED = _DeferredStatus()


def raise_deferred_non_finite() -> None:
    """Raise now for any non-finite tokens (or tensor alpha out of its range) that an earlier CUDA call with
    ``check='auto'`` met (waits for them)."""
    _DEFERRED.raise_ready(wait=True)


def _raise_for_code(code: int, options, dtype: torch.dtype, x) -> None:
    if code == BAD_ALPHA:
        raise options.alpha_refusal()
    if code == BAD_INPUT:
        if x is None:
            raise ValueError(_input_message(options.where))
        raise ValueError(_input_message(options.where, int((~torch.isfinite(x)).sum()), x.numel()))
    if code == BAD_OUTPUT:
        raise ValueError(_output_message(options.where, dtype))


def _in_traced_program() -> bool:
    return torch.compiler.is_compiling() or (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())


def report_status(status: torch.Tensor, x: torch.Tensor, options) -> None:
    """Raise (now or deferred, per ``options.check``) when a status of the batched path is not FINE; ``x`` the
    tokens, ``options`` the :class:`.ConditioningOptions` of the call (its ``where`` and alpha name the error)."""
    if options.check is False or status.numel() == 0:
        return
    if options.check is True or (x.device.type != 'cuda' and not _in_traced_program()):
        _raise_for_code(int(status.amax()), options, x.dtype, x)
    elif not _in_traced_program():
        _DEFERRED.raise_ready()
        _DEFERRED.push(status, options, x.dtype)


def condition_number(x: torch.Tensor) -> torch.Tensor:
    """kappa = s_max / s_min of each token matrix, computed in float64.

    Args:
        x (Tensor): (B, N, d) or (N, d).

    Returns:
        Tensor: float64 of shape (B,) (or a scalar for 2-D input); ``inf`` for a singular matrix, the
        zero matrix included. Non-finite input raises ValueError.
    """
    if x.dim() not in (2, 3):
        raise ValueError(f'condition_number: expected (B, N, d) or (N, d), got {tuple(x.shape)}')
    _check_finite(x, 'condition_number')
    s = torch.linalg.svdvals(x.detach().double())
    s_max, s_min = s[..., 0], s[..., -1]
    return torch.where(s_min > 0, s_max / torch.where(s_min > 0, s_min, torch.ones_like(s_min)),
                       torch.full_like(s_max, math.inf))
