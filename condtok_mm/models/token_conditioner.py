"""TokenConditioner: the config-buildable module around :mod:`condtok_mm.conditioning`."""
import math
from typing import Optional, Sequence, Tuple, Union

import torch
from mmengine.model import BaseModule

from condtok_mm.conditioning import (ALPHA_MAX, CONDITIONING_METHODS, CONDITIONING_MODES, GRAYING_EPSILON, SOLVERS,
                                     TOKEN_SCALE_CONTROLS, condition_token_windows, condition_tokens,
                                     condition_valid_regions, match_token_scale)
from condtok_mm.conditioning.valid_sizes import valid_size_tensor
from condtok_mm.registry import MODELS

CONDITIONING_SCOPES = ('image', 'window')
CONDITIONING_POSITIONS = ('embedding', 'attention_input')


@MODELS.register_module()
class TokenConditioner(BaseModule):
    """Add the correction C to each image's token matrix X so that kappa(X + C) <= ``target_kappa``.

    With ``scope='window'`` the bound is met by the token matrix of each attention window instead (see
    :func:`condtok_mm.conditioning.condition_token_windows`): the paper bounds kappa of the whole X, but a
    windowed-attention block only ever multiplies the tokens of one window with each other.

    It has no parameters and no buffers (adding it never changes a state dict) and is recomputed for every
    input, in training and inference. See :func:`condtok_mm.conditioning.condition_tokens` for the math.

    In a padded batch each image is conditioned on its own valid tokens only (``valid_shapes`` in
    :meth:`forward`, which the backbones fill in from :mod:`condtok_mm.models.valid_region`); padded tokens
    pass unchanged, so the correction an image gets does not depend on its batch-mates.

    Args:
        mode (str): 'sigma_max' (the paper's C = s_1 U V^T, all singular values shifted by s_1),
            'floor' (only singular values below s_1 / target_kappa are lifted) or 'graying' (Token Graying,
            arXiv 2505.01996: X -> U (S / s_1)^epsilon V^T, kappa -> kappa^epsilon, no bound; target_kappa
            unused). Default: 'sigma_max'.
        alpha (float): scale of the correction, in [0, 100]; 1 reaches the bound, 0 is the identity. Read at
            every forward, so a schedule may set ``conditioner.alpha`` between iterations (validated on set;
            on the batched path a new value recompiles nothing). Default: 1.0.
        target_kappa (float): the bound on kappa, finite and > 1. Default: 2.0.
        detach (bool): treat C as a constant in backward (the paper is silent; we default to the cheaper,
            always well-defined choice). Default: True.
        method (str): 'batched' (one masked program for the whole padded batch, no host sync with the
            Newton-Schulz solver; see :mod:`condtok_mm.conditioning.batched`), 'gram' or 'svd' (the float64
            reference, one image at a time). ``detach=False`` runs the reference ('gram'). Default: 'batched'.
        solver (str): the batched path's spectral solver: 'auto' (Newton-Schulz for sigma_max on CUDA, eigh
            otherwise), 'eigh' or 'newton_schulz' (sigma_max only). Default: 'auto'.
        check (bool or str): when non-finite tokens (in, or out of float16's range) raise: True at once, False
            never, 'auto' at once on the CPU and deferred to a later call on CUDA (no sync). Default: 'auto'.
        scope (str): 'image' (one N x C matrix per image, the paper's construction) or 'window' (one matrix
            per attention window; forward then needs ``hw_shape``). Default: 'image'.
        window_size (int, optional): side of the attention window, required with ``scope='window'``,
            e.g. 7 for Swin-T, 14 for ViTDet ViT-B. A backbone that owns the conditioner fills it in from
            its first attention block when it is not given. Default: None.
        shift_size (int): Swin's window shift, 0 <= shift_size < window_size, ``scope='window'`` only.
            Swin's first block of every stage is unshifted, so conditioning a stage input uses 0.
            Default: 0.
        centred (bool): condition each token matrix on the complement of the all-ones channel vector only,
            which is what the next LayerNorm lets through (see :mod:`condtok_mm.conditioning`).
            Default: False (the paper's construction).
        position (str): where the owning backbone applies the conditioner. 'embedding': the embedded tokens
            X, i.e. the residual stream before the first block (the paper). 'attention_input': the first
            block's norm1 output, leaving the residual stream and the token scale untouched; with
            ``scope='window'`` each attention window of it is conditioned, so kappa <= target_kappa holds
            on exactly what a windowed attention multiplies; with ``scope='image'`` the whole image's
            norm1 output is (its windows keep their own, larger kappa). Default: 'embedding'.
        epsilon (float): Token Graying's strength, 0 < epsilon <= 1 (smaller is stronger; 1 only rescales
            s_1 to 1), ``mode='graying'`` only. Default: 0.95 (the authors' default).
        control (str, optional): a token-scale control for studies that separate conditioning from the
            token scale it brings (see :func:`condtok_mm.conditioning.match_token_scale`; r = ||X + C||_F /
            ||X||_F per image, over its valid tokens, constant in backward). 'scale_matched': output r X
            (the conditioned model's token scale, X's kappa). 'norm_matched': output (X + C) / r (kappa <=
            target_kappa at X's scale). None: X + C, the method itself. Default: None.
        init_cfg (dict, optional): unused (no parameters); kept for the BaseModule interface.
    """

    def __init__(self,
                 mode: str = 'sigma_max',
                 alpha: float = 1.0,
                 target_kappa: float = 2.0,
                 detach: bool = True,
                 method: str = 'batched',
                 scope: str = 'image',
                 window_size: Optional[int] = None,
                 shift_size: int = 0,
                 centred: bool = False,
                 position: str = 'embedding',
                 epsilon: float = GRAYING_EPSILON,
                 control: Optional[str] = None,
                 solver: str = 'auto',
                 check='auto',
                 init_cfg: Optional[dict] = None):
        super().__init__(init_cfg=init_cfg)
        if mode not in CONDITIONING_MODES:
            raise ValueError(f'TokenConditioner: mode={mode!r} is not supported; valid modes are '
                             f'{", ".join(CONDITIONING_MODES)}')
        if method not in CONDITIONING_METHODS:
            raise ValueError(f'TokenConditioner: method={method!r} is not supported; valid methods are '
                             f'{", ".join(CONDITIONING_METHODS)}')
        if isinstance(target_kappa, bool) or not isinstance(target_kappa, (int, float)) \
                or not (math.isfinite(target_kappa) and target_kappa > 1):
            raise ValueError(f'TokenConditioner: target_kappa={target_kappa!r} is invalid; use a finite number '
                             '> 1 (the paper uses 2.0)')
        if solver not in SOLVERS:
            raise ValueError(f'TokenConditioner: solver={solver!r} is not supported; valid solvers are '
                             f'{", ".join(SOLVERS)}')
        if solver == 'newton_schulz' and mode != 'sigma_max':
            raise ValueError(f"TokenConditioner: solver='newton_schulz' computes mode='sigma_max' only; use "
                             f"solver='auto' or 'eigh' with mode={mode!r}")
        if not (check == 'auto' or check is True or check is False):
            raise ValueError(f"TokenConditioner: check={check!r} is invalid; use 'auto', True or False")
        if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)) or not 0 < epsilon <= 1:
            raise ValueError(f'TokenConditioner: epsilon={epsilon!r} is invalid; use a number in (0, 1] '
                             f"(mode='graying': kappa -> kappa^epsilon; the authors use {GRAYING_EPSILON})")
        if not isinstance(detach, bool):
            raise ValueError(f'TokenConditioner: detach={detach!r} is invalid; use True or False')
        if not isinstance(centred, bool):
            raise ValueError(f'TokenConditioner: centred={centred!r} is invalid; use True or False')
        if position not in CONDITIONING_POSITIONS:
            raise ValueError(f'TokenConditioner: position={position!r} is not supported; valid positions are '
                             f'{", ".join(CONDITIONING_POSITIONS)}')
        if control is not None and control not in TOKEN_SCALE_CONTROLS:
            raise ValueError(f'TokenConditioner: control={control!r} is not supported; use None (the method) or '
                             f'one of {", ".join(TOKEN_SCALE_CONTROLS)}')
        if scope not in CONDITIONING_SCOPES:
            raise ValueError(f'TokenConditioner: scope={scope!r} is not supported; valid scopes are '
                             f'{", ".join(CONDITIONING_SCOPES)}')
        if scope == 'image' and (window_size is not None or shift_size != 0):
            raise ValueError(f'TokenConditioner: window_size={window_size!r} and shift_size={shift_size!r} '
                             "apply to scope='window' only; scope='image' conditions the whole image")
        if scope == 'window' and not (isinstance(window_size, int) and not isinstance(window_size, bool)
                                      and window_size >= 1):
            raise ValueError(f"TokenConditioner: scope='window' needs window_size, an integer >= 1 (the "
                             f'attention window of the first block), got {window_size!r}')
        if scope == 'window' and not (isinstance(shift_size, int) and not isinstance(shift_size, bool)
                                      and 0 <= shift_size < window_size):
            raise ValueError(f'TokenConditioner: shift_size={shift_size!r} is invalid; use an integer in '
                             f'[0, window_size={window_size})')
        self.mode = mode
        self.alpha = alpha  # validated by the property
        self.target_kappa = float(target_kappa)
        self.detach = detach
        self.method = method
        self.scope = scope
        self.window_size = window_size
        self.shift_size = shift_size
        self.centred = centred
        self.position = position
        self.epsilon = float(epsilon)
        self.control = control
        self.solver = solver
        self.check = check
        # Set by the owning backbone so that errors name the place, e.g. 'CondSwinTransformer stage 0'.
        self.location = type(self).__name__

    @property
    def alpha(self) -> float:
        return self._alpha

    @alpha.setter
    def alpha(self, value: float) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= ALPHA_MAX:
            raise ValueError(f'TokenConditioner: alpha={value!r} is invalid; use a number in [0, {ALPHA_MAX:g}] '
                             '(1.0 reaches the bound, 0 disables the correction)')
        self._alpha = float(value)
        # the value the batched path reads: one 0-dim CPU tensor, updated in place, so that a compiled
        # conditioner sees the new strength without recompiling (a CUDA-graph capture keeps the value it was
        # captured with); not a buffer, so the state dict stays empty
        if not hasattr(self, '_alpha_value'):
            self._alpha_value = torch.zeros((), dtype=torch.float64)
        self._alpha_value.fill_(self._alpha)

    def forward(self, tokens: torch.Tensor, hw_shape: Optional[Tuple[int, int]] = None,
                valid_shapes: Optional[Union[Sequence[Tuple[int, int]], torch.Tensor]] = None) -> torch.Tensor:
        """Condition tokens of shape (B, N, C).

        Args:
            tokens (Tensor): (B, N, C), one N x C matrix per image, row-major over the token grid.
            hw_shape (tuple[int, int], optional): the token grid (H, W) with H * W = N; needed by
                ``scope='window'`` and with ``valid_shapes``; with ``scope='image'`` it places the
                null-space completion on bands of whole token rows (see :mod:`condtok_mm.conditioning`).
            valid_shapes (Sequence[tuple[int, int]] or Tensor, optional): per image, the (h, w) top-left part
                of the grid that holds its valid (unpadded) tokens: non-negative integers, or an integer (B, 2)
                tensor (kept on the device; see :func:`condtok_mm.conditioning.condition_valid_regions`). Image i
                is conditioned as the matrix of those h * w tokens (window scope: windows cut to them, windows
                wholly outside pass unchanged); the other tokens are returned unchanged. None: every token is
                valid.
        """
        if torch.onnx.is_in_onnx_export():
            # Fail before the exporter traces the rest of the model and stops deep inside on the operator.
            raise RuntimeError(
                f'{self.location} (mode={self.mode!r}, method={self.method!r}, scope={self.scope!r}) cannot be '
                'exported to ONNX: ONNX has no eigendecomposition or SVD operator, and the conditioning computes '
                "one for every input (method='batched' and 'gram': torch.linalg.eigh, or Newton-Schulz matmuls on "
                "CUDA; method='svd': torch.linalg.svd). "
                'Options: deploy a TorchScript model made with torch.jit.trace at the input size you deploy '
                "(it keeps these operators and fixes the shapes; torch.export.export stops on the conditioner's "
                'data-dependent checks), or export the baseline twin '
                '(conditioning=None, the config without -condtok), which is a different model from this trained '
                'one.')
        options = dict(mode=self.mode, alpha=self._alpha_value, target_kappa=self.target_kappa, detach=self.detach,
                       method=self.method, where=self.location, centred=self.centred, epsilon=self.epsilon,
                       solver=self.solver, check=self.check)
        window = dict(window_size=self.window_size, shift_size=self.shift_size) if self.scope == 'window' else {}
        if hw_shape is None:
            if self.scope == 'window':
                raise ValueError(f"{self.location}: scope='window' needs the token grid: call "
                                 'conditioner(tokens, hw_shape=(H, W))')
            if valid_shapes is not None:
                raise ValueError(f'{self.location}: valid_shapes needs the token grid: call '
                                 'conditioner(tokens, hw_shape=(H, W), valid_shapes=...)')
            return self._control(tokens, condition_tokens(tokens, **options))
        batch, num_tokens, channels = tokens.shape
        if valid_shapes is not None:
            valid_shapes = valid_size_tensor(valid_shapes, batch, tokens.device, self.location)
        if self.scope == 'window' and valid_shapes is None:
            return self._control(tokens, condition_token_windows(tokens, hw_shape, **window, **options))
        height, width = hw_shape
        if height * width != num_tokens:
            raise ValueError(f'{self.location}: {num_tokens} tokens do not fill the grid hw_shape='
                             f'{tuple(hw_shape)} ({height} x {width} = {height * width})')
        grid = tokens.reshape(batch, height, width, channels)
        if valid_shapes is None:
            return self._control(tokens, condition_tokens(grid, **options).view(tokens.shape))
        conditioned = condition_valid_regions(grid, valid_shapes, **window, **options)
        if self.control is None:
            return conditioned.view(tokens.shape)
        return match_token_scale(grid, conditioned, self.control, valid_shapes).view(tokens.shape)

    def _control(self, tokens: torch.Tensor, conditioned: torch.Tensor) -> torch.Tensor:
        """The output for every token valid: X + C, or its token-scale control."""
        return conditioned if self.control is None else match_token_scale(tokens, conditioned, self.control)

    def extra_repr(self) -> str:
        window = (f', window_size={self.window_size}, shift_size={self.shift_size}'
                  if self.scope == 'window' else '')
        return (f'mode={self.mode!r}, alpha={self.alpha}, target_kappa={self.target_kappa}, '
                f'detach={self.detach}, method={self.method!r}, scope={self.scope!r}{window}, '
                f'centred={self.centred}, position={self.position!r}, control={self.control!r}, '
                f'solver={self.solver!r}, check={self.check!r}'
                + (f', epsilon={self.epsilon}' if self.mode == 'graying' else ''))


def build_token_conditioner(cfg: dict, location: str,
                            attention_window: Optional[Tuple[int, int]]) -> torch.nn.Module:
    """Build a conditioner for the tokens that enter an attention block, matching its window partition.

    A per-window conditioner must see the windows that the block attends within; when its config leaves
    ``window_size``/``shift_size`` out, they are taken from the block.

    Args:
        cfg (dict): the conditioner config, e.g. ``dict(type='TokenConditioner', scope='window')``.
        location (str): where it sits, for error messages, e.g. 'CondViT patch embedding'.
        attention_window (tuple[int, int], optional): (window_size, shift_size) of the first attention
            block after the conditioner, or None when that block attends globally.

    Raises:
        ValueError: when a per-window conditioner does not match the block's windows.
    """
    cfg = dict(cfg)
    if cfg.get('scope') == 'window' and attention_window is not None:
        cfg.setdefault('window_size', attention_window[0])
        cfg.setdefault('shift_size', attention_window[1])
    elif cfg.get('scope') == 'window':
        raise ValueError(f"{location}: scope='window' but the attention block it feeds attends globally "
                         "(no windows); use scope='image'")
    conditioner = MODELS.build(cfg)
    conditioner.location = location
    if getattr(conditioner, 'scope', 'image') == 'window':
        own = (conditioner.window_size, conditioner.shift_size)
        if attention_window is None or own != tuple(attention_window):
            feeds = ('global attention' if attention_window is None else
                     f'window_size={attention_window[0]}, shift_size={attention_window[1]}')
            raise ValueError(
                f'{location}: per-window conditioning uses window_size={own[0]}, shift_size={own[1]} but '
                f'the attention block it feeds uses {feeds}; leave window_size and shift_size out of the '
                "conditioning config to take the block's own")
    return conditioner
