"""Conditioned embedded tokens: the correction that bounds kappa of a token matrix.

Pure PyTorch, no OpenMMLab imports. Reference: H. Saratchandran and S. Lucey, "Enhancing Transformers
Through Conditioned Embedded Tokens", ICCV 2025 (arXiv 2505.12789).

For one image, X is the N x d matrix of embedded tokens, with thin SVD X = U S V^T, singular values
s_1 >= ... >= s_r >= 0 (r = min(N, d)) and condition number kappa(X) = s_1 / s_r. A correction C moves
every singular value up while keeping the singular vectors:

    X + C = U (S + D) V^T,   C = U D V^T,   D = alpha * diag(g(s_i))

``mode='sigma_max'`` (the paper's construction):  g(s_i) = s_1 / (t - 1)
    With t = target_kappa = 2 this is C = s_1 U V^T and the singular values land in [s_1, 2 s_1].
``mode='floor'``:  g(s_i) = max(s_1 / t - s_i, 0)
    Lifts only the singular values below s_1 / t to s_1 / t and leaves the rest of X untouched.

Both give kappa(X + C) <= t for alpha = 1; alpha scales C (alpha = 0 is the identity).

``mode='graying'`` (Token Graying, arXiv 2505.01996, "Always Skip Attention"):  X + C = U (S / s_1)^eps V^T
    The paper's map, faithfully: every singular value becomes (s_i / s_1)^eps with 0 < eps <= 1 (``epsilon``),
    so kappa -> kappa^eps and the result is rescaled to s_1 = 1 (it does not scale with X). target_kappa plays
    no part; alpha still scales C = U ((S / s_1)^eps - S) V^T. Where the paper is silent we decided: singular
    values at round-off level (s_i <= RANK_RTOL * s_1, the null directions below) map to 0, not to
    (s_i / s_1)^eps. The map has infinite slope at 0, so it would amplify round-off (e.g. 1e-8 -> 4e-3 at
    eps = 0.3) into directions X does not have; a rank-deficient X therefore stays rank-deficient (graying
    lifts nothing from zero and needs no null-space completion), and the zero matrix stays zero.

Rank-deficient X is the common case (a LayerNorm'd patch embedding has X 1 = 0; Swin-T's 4 x 4 x 3 -> 96 patch
embedding has rank <= 49), and then the guarantee needs U and V *completed* over the null directions: a zero
singular value must be lifted along some unit vector orthogonal to range(X). Two implementations:

``method='batched'`` (the default, :mod:`.batched`): one masked program for the whole padded batch, no host
sync on the GPU. It conditions X~ = X + rho E, X plus a fixed canonical term of size rho = 1e-5 ||X||_F that
makes it full rank, so every spectral function of X~^T X~ is unique (no completion, no rank threshold, the same
result whatever the eigensolver or device) and continuous in X at every rank:

    X + C = X + alpha (X~ (I + M) - X),   M = h(X~^T X~)   (sigma_max: X~ (I + M) = X~ + c polar(X~)).

Tolerances (tests/conditioning/test_conditioning_batched.py): kappa(X + C) <= t (1 + 1e-4) at every rank (rank-deficient,
N < d, N close to d, constant, zero, padded); on full-rank inputs ||X + C - reference||_F / ||reference||_F
<= 3e-5 kappa(X) (the canonical term moves the small directions by about rho / s_min; measured 0.6e-5 to
0.9e-5 kappa); the eigh and Newton-Schulz solvers agree within 1e-4 (1e-3 where N < d).

``method='gram'`` / ``'svd'`` (:mod:`.reference`, the float64 reference and the tests' oracle): one image at a
time; the Gram path completes the null directions explicitly from fixed band and DCT-II candidates made canonical
(:mod:`.completion`), the SVD path takes LAPACK's completion. ``detach=False`` (the gradient through the SVD)
always runs here.

Centred variant (``centred=True``): a LayerNorm (the next block's norm1) subtracts each token's channel mean,
i.e. projects X onto the complement of the all-ones channel vector 1, so any part of C along 1 never reaches
the attention. The centred variant conditions Y = X Q, the coordinates of X in an orthonormal basis Q of that
complement (d - 1 columns), and adds C = C_Y Q^T: kappa(Y + C_Y) <= t, and C 1 = 0. Q is taken from one
Householder reflection H (H 1/sqrt(d) = e_1, Q = H[:, 1:]), so X Q and C_Y Q^T cost O(N d) each. Where the
ones vector is X's only null direction (a LayerNorm'd patch embedding with at least as many pixel values
per patch as channels), Y has full rank and nothing needs completing.

Token-scale controls (:func:`match_token_scale`): the correction also makes the tokens bigger, by
r = ||X + C||_F / ||X||_F per image (4-5 for ``sigma_max`` on LayerNorm'd patch embeddings), which by itself
shrinks every block's residual update relative to the stream. Two parameter-free controls separate the two
effects: ``'scale_matched'`` returns r X (the conditioned model's token scale, kappa unchanged; the next
LayerNorm is scale invariant, so the first attention sees what the baseline's sees) and ``'norm_matched'``
returns (X + C) / r (kappa(X + C) <= t at the baseline's token scale; the first attention sees what the
conditioned model's sees). r is a constant in backward.

Per-window conditioning (:func:`condition_token_windows`) applies the same construction to the token matrix
of each attention window of a windowed-attention backbone (Swin, ViTDet) instead of the whole image.
"""
from typing import Optional, Sequence, Tuple, Union

import torch

from .autograd import _ConstantCorrection
from .batched import condition_masked, finish, resolve_solver
from .centred import _from_channel_mean_complement, channel_mean_complement
from .diagnostics import condition_number, raise_deferred_non_finite, report_status
from .modes import (ALPHA_MAX, BOUNDING_MODES, CHECKS, CONDITIONING_METHODS, CONDITIONING_MODES, GRAYING_EPSILON,
                    RANK_RTOL, SOLVERS, TOKEN_SCALE_CONTROLS, check_arguments)
from .reference import (reference_condition_grid, reference_token_windows, reference_valid_regions, token_correction,
                        write_conditioned)
from .token_scale import match_token_scale
from .valid_sizes import valid_size_tensor
from .windows import token_windows, window_stack

__all__ = ['condition_tokens', 'condition_token_windows', 'condition_valid_regions', 'condition_number',
           'token_correction', 'write_conditioned', 'token_windows', 'channel_mean_complement',
           'match_token_scale', 'raise_deferred_non_finite', 'BOUNDING_MODES', 'CONDITIONING_MODES',
           'CONDITIONING_METHODS', 'GRAYING_EPSILON', 'TOKEN_SCALE_CONTROLS', 'SOLVERS', 'CHECKS', 'ALPHA_MAX',
           'RANK_RTOL']

ValidShapes = Union[Sequence[Tuple[int, int]], torch.Tensor]


def condition_tokens(x: torch.Tensor, mode: str = 'sigma_max', alpha: float = 1.0,
                     target_kappa: float = 2.0, detach: bool = True, method: str = 'batched',
                     where: str = 'condition_tokens', centred: bool = False,
                     epsilon: float = GRAYING_EPSILON, solver: str = 'auto', check='auto') -> torch.Tensor:
    """Return X + C for a batch of token matrices, so that kappa(X + C) <= target_kappa per sample
    (kappa(X + C) = kappa(X)^epsilon with ``mode='graying'``).

    Args:
        x (Tensor): token matrices of shape (B, N, d) or (N, d), or token grids (B, H, W, d) (each the
            H*W x d matrix of its tokens, row-major); any floating dtype. The correction is computed in float64
            and the result is returned in ``x.dtype``.
        mode (str): 'sigma_max' (C = s_1/(t-1) U V^T, the paper's construction), 'floor' (lift only
            the singular values below s_1/t to s_1/t) or 'graying' (X + C = U (S/s_1)^epsilon V^T, Token
            Graying; see the module docstring). Default: 'sigma_max'.
        alpha (float or Tensor): scale of the correction, in [0, ALPHA_MAX = 100]; 1 reaches the bound, 0
            disables it. A 0-dim CPU tensor is used as it is, unread and unchecked (a schedule that updates it in
            place changes the strength of a compiled or captured program without recompiling). Default: 1.0.
        target_kappa (float): the bound t > 1, finite ('sigma_max', 'floor'). Default: 2.0 (the paper's value).
        detach (bool): treat C as a constant in backward, so the gradient w.r.t. ``x`` is the identity.
            With False the gradient flows through the SVD (on the reference path, ``method='gram'`` unless
            'svd' is given); directions that are (nearly) null or have (nearly) equal singular values contribute
            no gradient instead of an infinite one. Default: True.
        method (str): 'batched' (one masked program for the batch, see the module docstring), 'gram' or 'svd'
            (the float64 reference, one image at a time). Default: 'batched'.
        where (str): a name for error messages, e.g. the module that calls this.
        centred (bool): condition X on the complement of the all-ones channel vector only (see the module
            docstring): kappa(X Q + C Q) <= target_kappa and C 1 = 0, so nothing is lifted along the
            direction the next LayerNorm removes. Default: False (the paper's construction).
        epsilon (float): Token Graying's exponent, 0 < epsilon <= 1 ('graying' only; 1 keeps the singular
            values' ratios, smaller is stronger). Default: 0.95 (the authors' default).
        solver (str): the batched path's spectral solver: 'eigh', 'newton_schulz' (sigma_max only; matmuls,
            no host sync) or 'auto' (Newton-Schulz for sigma_max on CUDA, eigh otherwise). Default: 'auto'.
        check (bool or str): when non-finite tokens raise (batched path): True at once, False never, 'auto' at
            once on the CPU and deferred on CUDA (:mod:`.diagnostics`). Default: 'auto'.

    Returns:
        Tensor: X + C with the shape and dtype of ``x``. A zero matrix is returned unchanged.

    Raises:
        ValueError: on NaN/Inf in ``x``, on X + C that overflows ``x.dtype`` (float16), or on invalid arguments.
    """
    check_arguments(mode, alpha, target_kappa, method, epsilon, solver, check, where)
    if x.dim() not in (2, 3, 4):
        raise ValueError(f'{where}: expected tokens of shape (B, N, d), (N, d) or (B, H, W, d), got '
                         f'{tuple(x.shape)}')
    if not x.is_floating_point():
        raise ValueError(f'{where}: expected floating-point tokens, got {x.dtype}')
    grid = {2: lambda t: t[None, :, None], 3: lambda t: t[:, :, None], 4: lambda t: t}[x.dim()](x)
    if grid.numel() == 0:
        return x
    options = dict(mode=mode, alpha=alpha, target_kappa=target_kappa, where=where, centred=centred, epsilon=epsilon)
    if _on_reference_path(method, detach, grid):
        options['alpha'] = float(alpha)
        out = reference_condition_grid(grid, detach=detach, method=_reference_method(method), **options)
    else:
        out = _condition_batched(grid, None, None, 0, solver=solver, check=check, **options)
    return out.view(x.shape)


def condition_valid_regions(grid: torch.Tensor, valid_shapes: ValidShapes, window_size: Optional[int] = None,
                            shift_size: int = 0, detach: bool = True, mode: str = 'sigma_max', alpha: float = 1.0,
                            target_kappa: float = 2.0, method: str = 'batched', where: str = 'condition_valid_regions',
                            centred: bool = False, epsilon: float = GRAYING_EPSILON, solver: str = 'auto',
                            check='auto') -> torch.Tensor:
    """Condition image b on the top-left ``valid_shapes[b]`` part of its token grid only; the other tokens
    (padding) pass unchanged.

    Args:
        grid (Tensor): token grids (B, H, W, d) of a padded batch.
        valid_shapes (Sequence[tuple[int, int]] or Tensor): per image, the (h, w) of its valid tokens:
            non-negative integers, or an integer tensor (B, 2) (on the batched path it stays on the device and
            sizes beyond the grid are clipped to it; a new set of sizes then recompiles nothing).
        window_size (int, optional): condition each attention window of the valid region on its own
            (:func:`condition_token_windows`; windows cut by the valid region keep their valid tokens, a window
            with none passes unchanged). None: the valid region as one matrix. Default: None.
        shift_size (int): Swin's window shift, with ``window_size``. Default: 0.
        detach, mode, alpha, target_kappa, method, where, centred, epsilon, solver, check: see
            :func:`condition_tokens`.

    Returns:
        Tensor: the conditioned grids, shape and dtype of ``grid``.
    """
    check_arguments(mode, alpha, target_kappa, method, epsilon, solver, check, where)
    if grid.dim() != 4:
        raise ValueError(f'{where}: expected token grids (B, H, W, d), got {tuple(grid.shape)}')
    sizes = valid_size_tensor(valid_shapes, grid.shape[0], grid.device, where)
    options = dict(mode=mode, alpha=alpha, target_kappa=target_kappa, where=where, centred=centred, epsilon=epsilon)
    if _on_reference_path(method, detach, grid):
        options['alpha'] = float(alpha)
        shapes = [tuple(size) for size in sizes.tolist()]
        return reference_valid_regions(grid, shapes, window_size, shift_size, detach=detach,
                                       method=_reference_method(method), **options)
    return _condition_batched(grid, sizes, window_size, shift_size, solver=solver, check=check, **options)


def condition_token_windows(x: torch.Tensor, hw_shape: Tuple[int, int], window_size: int, shift_size: int = 0,
                            where: str = 'condition_token_windows', **kwargs) -> torch.Tensor:
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
        where (str): a name for error messages.
        **kwargs: mode, alpha, target_kappa, detach, method, centred, epsilon, solver, check of
            :func:`condition_tokens`.

    Returns:
        Tensor: the conditioned tokens, shape and dtype of ``x``.
    """
    if not (isinstance(window_size, int) and not isinstance(window_size, bool) and window_size >= 1):
        raise ValueError(f'{where}: window_size must be an integer >= 1, got {window_size!r}')
    if not (isinstance(shift_size, int) and not isinstance(shift_size, bool) and 0 <= shift_size < window_size):
        raise ValueError(f'{where}: shift_size must be an integer in [0, window_size={window_size}), '
                         f'got {shift_size!r}')
    if x.dim() != 3:
        raise ValueError(f'{where}: expected tokens of shape (B, H*W, d), got {tuple(x.shape)}')
    height, width = hw_shape
    batch, num_tokens, channels = x.shape
    if num_tokens != height * width:
        raise ValueError(f'{where}: {num_tokens} tokens do not fill the grid hw_shape={tuple(hw_shape)} '
                         f'({height} x {width} = {height * width})')
    options = dict(mode='sigma_max', alpha=1.0, target_kappa=2.0, detach=True, method='batched', centred=False,
                   epsilon=GRAYING_EPSILON, solver='auto', check='auto')
    unknown = set(kwargs) - set(options)
    if unknown:
        raise TypeError(f'{where}: unexpected options {sorted(unknown)}')
    options.update(kwargs)
    check_arguments(options['mode'], options['alpha'], options['target_kappa'], options['method'],
                    options['epsilon'], options['solver'], options['check'], where)
    grid = x.reshape(batch, height, width, channels)
    if _on_reference_path(options['method'], options['detach'], grid):
        options.pop('solver'), options.pop('check')
        options['method'] = _reference_method(options['method'])
        options['alpha'] = float(options['alpha'])
        return reference_token_windows(x, hw_shape, window_size, shift_size, where=where, **options)
    options.pop('detach'), options.pop('method')
    return _condition_batched(grid, None, window_size, shift_size, where=where, **options).reshape(x.shape)


def _on_reference_path(method: str, detach: bool, grid: torch.Tensor) -> bool:
    """The reference runs method='gram'/'svd', and detach=False where a gradient is wanted (through the SVD)."""
    return method != 'batched' or (not detach and torch.is_grad_enabled() and grid.requires_grad)


def _reference_method(method: str) -> str:
    return 'gram' if method == 'batched' else method


def _condition_batched(grid: torch.Tensor, sizes: Optional[torch.Tensor], window_size: Optional[int],
                       shift_size: int, mode: str, alpha: float, target_kappa: float, where: str, centred: bool,
                       epsilon: float, solver: str, check) -> torch.Tensor:
    """The batched path for token grids (B, H, W, d): valid region ``sizes`` (B, 2) (None: all valid), per
    attention window when ``window_size`` is given. C is a constant in backward."""
    batch, height, width, channels = grid.shape
    with torch.no_grad():
        tokens = grid.detach()
        if sizes is None:
            mask = torch.ones(batch, height, width, dtype=torch.bool, device=grid.device)
        else:
            rows = torch.arange(height, device=grid.device)
            cols = torch.arange(width, device=grid.device)
            mask = (rows[None, :, None] < sizes[:, 0, None, None]) & (cols[None, None, :] < sizes[:, 1, None, None])
        if centred and channels < 2:  # a single channel is all channel mean: nothing to condition
            _, status = condition_masked(tokens.reshape(batch, -1, channels), mask.reshape(batch, -1), mode, 0.0,
                                         target_kappa, epsilon, 'eigh')
            out = tokens.clone()
        else:
            inner = channel_mean_complement(tokens.double()) if centred else tokens
            if window_size is None:
                stack, stack_mask = inner.reshape(batch, height * width, -1), mask.reshape(batch, -1)
                unstack = lambda t: t.view(batch, height, width, -1)  # noqa: E731
            else:
                stack, stack_mask, unstack = window_stack(inner, mask, window_size, shift_size)
            conditioned, status = condition_masked(stack, stack_mask, mode, alpha, target_kappa, epsilon,
                                                   resolve_solver(solver, mode, grid.device))
            conditioned = unstack(conditioned)
            status = status.view(batch, -1).amax(-1)
            if centred:
                conditioned = tokens.double() + _from_channel_mean_complement(conditioned - inner)
            out = finish(tokens, conditioned, mask)
    report_status(status, tokens, check, where)
    return _ConstantCorrection.apply(grid, out) if torch.is_grad_enabled() and grid.requires_grad else out
