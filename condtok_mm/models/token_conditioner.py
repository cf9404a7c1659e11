"""TokenConditioner: the config-buildable module around :mod:`condtok_mm.conditioning`."""
from typing import Optional, Sequence, Tuple, Union

import torch
from mmengine.model import BaseModule

from condtok_mm.conditioning import (ConditioningOptions, TOKEN_SCALE_CONTROLS, condition_token_windows,
                                     condition_tokens, condition_valid_regions, match_token_scale)
from condtok_mm.conditioning.functional import check_window
from condtok_mm.conditioning.modes import GRAYING_MODES
from condtok_mm.conditioning.valid_sizes import valid_size_tensor
from condtok_mm.conditioning.windows import tokens_as_grid
from condtok_mm.registry import MODELS

CONDITIONING_SCOPES = ('image', 'window')
CONDITIONING_POSITIONS = ('embedding', 'attention_input')
# the conditioner's own arguments (not options of the math), checked together with the options on every set
LAYOUT = ('scope', 'window_size', 'shift_size', 'position', 'control')


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
        scope (str): 'image' (one N x C matrix per image, the paper's construction) or 'window' (one matrix
            per attention window; forward then needs ``hw_shape``). Default: 'image'.
        window_size (int, optional): side of the attention window, required with ``scope='window'``,
            e.g. 7 for Swin-T, 14 for ViTDet ViT-B. A backbone that owns the conditioner fills it in from
            its first attention block when it is not given. Default: None.
        shift_size (int): Swin's window shift, 0 <= shift_size < window_size, ``scope='window'`` only.
            Swin's first block of every stage is unshifted, so conditioning a stage input uses 0.
            Default: 0.
        position (str): where the owning backbone applies the conditioner. 'embedding': the embedded tokens
            X, i.e. the residual stream before the first block (the paper). 'attention_input': the first
            block's norm1 output, leaving the residual stream and the token scale untouched; with
            ``scope='window'`` each attention window of it is conditioned, so kappa <= target_kappa holds
            on exactly what a windowed attention multiplies; with ``scope='image'`` the whole image's
            norm1 output is (its windows keep their own, larger kappa). Default: 'embedding'.
        control (str, optional): a token-scale control for studies that separate conditioning from the
            token scale it brings (see :func:`condtok_mm.conditioning.match_token_scale`; r = ||X + C||_F /
            ||X||_F per image, over its valid tokens, constant in backward). 'scale_matched': output r X
            (the conditioned model's token scale, X's kappa). 'norm_matched': output (X + C) / r (kappa <=
            target_kappa at X's scale). None: X + C, the method itself. Default: None.
        init_cfg (dict, optional): unused (no parameters); kept for the BaseModule interface.
        **options: the conditioning options, as in :class:`condtok_mm.conditioning.ConditioningOptions`, which
            documents and checks them: ``mode`` ('sigma_max', 'floor', 'graying', 'graying_dct'), ``alpha`` (the
            strength, 1.0), ``target_kappa`` (2.0), ``detach`` (True: C is a constant in backward; the paper is
            silent, we default to the cheaper, always well-defined choice), ``method`` ('batched'), ``centred``,
            ``epsilon`` (the graying modes), ``solver`` ('auto') and ``check`` ('auto'). Each is also an attribute: a
            schedule may set ``conditioner.alpha`` between iterations (checked on set; on the batched path a new
            value recompiles nothing), and setting any option checks the whole set again.
    """

    def __init__(self,
                 scope: str = 'image',
                 window_size: Optional[int] = None,
                 shift_size: int = 0,
                 position: str = 'embedding',
                 control: Optional[str] = None,
                 init_cfg: Optional[dict] = None,
                 **options):
        super().__init__(init_cfg=init_cfg)
        self.options = ConditioningOptions.resolve(None, type(self).__name__, options)
        layout = dict(scope=scope, window_size=window_size, shift_size=shift_size, position=position, control=control)
        check_layout(self.options, **layout)
        self.__dict__.update(layout)

    @property
    def location(self) -> str:
        """Where the conditioner sits, the name its errors start with, e.g. 'CondSwinTransformer stage 0' (set
        by the owning backbone)."""
        return self.options.where

    @location.setter
    def location(self, value: str) -> None:
        self.options = self.options.replace(where=value)

    def __getattr__(self, name: str):
        options = self.__dict__.get('options')
        if options is not None and name in ConditioningOptions.names():
            return getattr(options, name)
        return super().__getattr__(name)

    def __setattr__(self, name: str, value) -> None:
        if name == 'options':
            if all(key in self.__dict__ for key in LAYOUT):  # a new mode may not suit the scope
                check_layout(value, **{key: self.__dict__[key] for key in LAYOUT})
            self.__dict__['options'] = value
            # the strength the batched path reads: one 0-dim CPU tensor, updated in place, so that a compiled
            # conditioner sees a new alpha without recompiling (a CUDA-graph capture keeps the value it was
            # captured with); not a buffer, so the state dict stays empty
            if '_alpha_value' not in self.__dict__:
                self.__dict__['_alpha_value'] = torch.zeros((), dtype=torch.float64)
            self.__dict__['_alpha_value'].fill_(float(value.alpha))
            self.__dict__['_forward_options'] = value.replace(alpha=self.__dict__['_alpha_value'])
        elif name in ConditioningOptions.names() and 'options' in self.__dict__:
            self.options = self.options.replace(**{name: value})
        elif name in LAYOUT and all(key in self.__dict__ for key in LAYOUT):
            check_layout(self.options, **dict({key: self.__dict__[key] for key in LAYOUT}, **{name: value}))
            self.__dict__[name] = value
        else:
            super().__setattr__(name, value)

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
        options = self.export_options() if torch.onnx.is_in_onnx_export() else self._forward_options
        window = dict(window_size=self.window_size, shift_size=self.shift_size) if self.scope == 'window' else {}
        if hw_shape is None:
            if self.scope == 'window':
                raise ValueError(f"{self.location}: scope='window' needs the token grid: call "
                                 'conditioner(tokens, hw_shape=(H, W))')
            if self.mode == 'graying_dct':
                raise ValueError(f"{self.location}: mode='graying_dct' needs the token grid: call "
                                 'conditioner(tokens, hw_shape=(H, W))')
            if valid_shapes is not None:
                raise ValueError(f'{self.location}: valid_shapes needs the token grid: call '
                                 'conditioner(tokens, hw_shape=(H, W), valid_shapes=...)')
            return self._control(tokens, condition_tokens(tokens, options=options))
        batch, num_tokens, channels = tokens.shape
        if valid_shapes is not None:
            valid_shapes = valid_size_tensor(valid_shapes, batch, tokens.device, self.location)
        if self.scope == 'window' and valid_shapes is None:
            return self._control(tokens, condition_token_windows(tokens, hw_shape, **window, options=options))
        grid = tokens_as_grid(tokens, hw_shape, self.location)
        if valid_shapes is None:
            return self._control(tokens, condition_tokens(grid, options=options).view(tokens.shape))
        conditioned = condition_valid_regions(grid, valid_shapes, **window, options=options)
        if self.control is None:
            return conditioned.view(tokens.shape)
        return match_token_scale(grid, conditioned, self.control, valid_shapes).view(tokens.shape)

    def export_options(self) -> ConditioningOptions:
        """The forward options inside an ONNX export, or a RuntimeError naming the fix where the export would fail
        deep inside the model or compute another correction than this module does (:mod:`condtok_mm.deployment`
        asks every conditioner before it exports: torch's exporter retries a failed capture in other ways and
        then reports the operator it stopped at instead of this error).

        ONNX has no eigendecomposition or SVD operator: only mode='sigma_max' on the batched path with
        solver='newton_schulz' (matrix products, a fixed number of steps) exports. check=False: an exported graph
        cannot raise from data, and reading the status back is a data-dependent host read that the exporter cannot
        trace; non-finite tokens come out non-finite from the graph instead of raising.
        """
        where = f'{self.location} (mode={self.mode!r}, method={self.method!r}, solver={self.solver!r})'
        if torch.jit.is_tracing():
            raise RuntimeError(
                f'{where}: torch.onnx.export(..., dynamo=False), the TorchScript-based exporter, drops the in-place '
                "updates of a matrix diagonal that the Newton-Schulz solver makes, so its graph would compute another "
                'correction than this module; export with tools/deployment/export_onnx.py, or '
                'condtok_mm.deployment.export_onnx (torch.onnx.export with dynamo=True and the ONNX translations '
                'the conditioning needs)')
        if self.mode != 'sigma_max' or self.method != 'batched':
            raise RuntimeError(
                f'{where} cannot be exported to ONNX: ONNX has no eigendecomposition or SVD operator, and only '
                "mode='sigma_max' with method='batched' and solver='newton_schulz' computes the correction from "
                "matrix products (mode='floor' and the graying modes need the eigenvalues themselves). Options: "
                'deploy a TorchScript model made with torch.jit.trace at the input size you deploy, or export the '
                'baseline twin (conditioning=None, the config without -condtok), which is a different model from '
                'this trained one.')
        if self.solver != 'newton_schulz':
            raise RuntimeError(
                f"{where} cannot be exported to ONNX as it is: solver={self.solver!r} computes an eigendecomposition "
                "('auto' is eigh off CUDA), which ONNX has no operator for; set solver='newton_schulz' (matrix "
                'products only; X + C within 1e-4 of eigh\'s). tools/deployment/export_onnx.py switches it and '
                'says so.')
        return self._forward_options.replace(check=False)

    def _control(self, tokens: torch.Tensor, conditioned: torch.Tensor) -> torch.Tensor:
        """The output for every token valid: X + C, or its token-scale control."""
        return conditioned if self.control is None else match_token_scale(tokens, conditioned, self.control)

    def extra_repr(self) -> str:
        options = [f'{name}={getattr(self.options, name)!r}' for name in ConditioningOptions.names()
                   if name != 'where' and (name != 'epsilon' or self.mode in GRAYING_MODES)]
        window = [f'window_size={self.window_size}', f'shift_size={self.shift_size}'] if self.scope == 'window' else []
        return ', '.join(options + [f'scope={self.scope!r}'] + window
                         + [f'position={self.position!r}', f'control={self.control!r}'])


def check_layout(options: ConditioningOptions, scope: str, window_size: Optional[int], shift_size: int, position: str,
                 control: Optional[str]) -> None:
    """Raise ValueError, in the options' wording and named by ``options.where``, unless the layout arguments of
    :class:`TokenConditioner` are valid together and with ``options``: at build and whenever one of them (or an
    option) is set.

    Args:
        options (ConditioningOptions): the conditioner's options (its mode decides whether a scope suits it).
        scope, window_size, shift_size, position, control: :class:`TokenConditioner`'s arguments of those names.
    """
    where = options.where
    if position not in CONDITIONING_POSITIONS:
        raise ValueError(f'{where}: position={position!r} is invalid; use one of '
                         f'{", ".join(map(repr, CONDITIONING_POSITIONS))}')
    if control is not None and control not in TOKEN_SCALE_CONTROLS:
        raise ValueError(f'{where}: control={control!r} is invalid; use None (the method) or one of '
                         f'{", ".join(map(repr, TOKEN_SCALE_CONTROLS))}')
    if scope not in CONDITIONING_SCOPES:
        raise ValueError(f'{where}: scope={scope!r} is invalid; use one of '
                         f'{", ".join(map(repr, CONDITIONING_SCOPES))}')
    if scope == 'image' and (window_size is not None or shift_size != 0):
        raise ValueError(f'{where}: window_size={window_size!r} and shift_size={shift_size!r} are invalid '
                         "with scope='image' (it conditions the whole image); use them with scope='window'")
    if scope == 'window':
        check_window(window_size, shift_size, where)
        if options.mode == 'graying_dct':
            raise ValueError(f"{where}: scope='window' is invalid with mode='graying_dct' (the DCT form transforms "
                             "each image's whole token grid); use scope='image', or mode='graying' per window")


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
