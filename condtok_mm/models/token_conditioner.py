"""TokenConditioner: the config-buildable module around :mod:`condtok_mm.conditioning`: its options (one
:class:`~condtok_mm.conditioning.ConditioningOptions`) and its placement (one :class:`.placement.Placement`)."""
import dataclasses
from typing import Optional, Sequence, Tuple, Union

import torch
from mmengine.model import BaseModule

from condtok_mm.conditioning import (ConditioningOptions, condition_token_windows, condition_tokens,
                                     condition_valid_regions)
from condtok_mm.conditioning.modes import GRAYING_MODES
from condtok_mm.conditioning.options import RENAMED, renamed_refusal
from condtok_mm.conditioning.windows import tokens_as_grid
from condtok_mm.models.placement import Placement, missing_grid
from condtok_mm.registry import MODELS


@MODELS.register_module()
class TokenConditioner(BaseModule):
    """Add the correction C to each image's token matrix X so that kappa(X + C) <= ``target_kappa``.

    A thin module: the options of the math are one :class:`~condtok_mm.conditioning.ConditioningOptions`, which
    documents and checks them, and where it acts is one :class:`~condtok_mm.models.placement.Placement` (scope,
    window, position), checked with them; :func:`condtok_mm.conditioning.condition_tokens` and its siblings do the
    work. With ``scope='window'`` the bound is met by the token matrix of each attention window instead of the
    whole image's: the paper bounds kappa of the whole X, but a windowed-attention block only ever multiplies the
    tokens of one window with each other.

    It has no parameters and no buffers (adding it never changes a state dict) and is recomputed for every
    input, in training and inference. In a padded batch each image is conditioned on its own valid tokens only
    (``valid_shapes`` in :meth:`forward`, which the owners fill in from :mod:`condtok_mm.models.valid_region`);
    padded tokens pass unchanged, so the correction an image gets does not depend on its batch-mates.

    Every option and placement argument is also an attribute (``conditioner.alpha``, ``conditioner.scope``): a
    schedule may set ``conditioner.alpha`` between iterations (checked on set; on the batched path a new value
    recompiles nothing), and setting any of them checks the whole set again. ``conditioner.where`` is the name its
    errors start with, set by the owner (e.g. 'CondSwinTransformer stage 0').

    Args:
        scope (str): 'image' or 'window' (forward then needs ``hw_shape``); see :class:`.placement.Placement`.
            Default: 'image'.
        window_size (int, optional): the attention window's side, ``scope='window'`` only, e.g. 7 for Swin-T, 14
            for ViTDet ViT-B (an owner fills in its first attention block's when it is left out). Default: None.
        shift_size (int): Swin's window shift, ``scope='window'`` only. Default: 0.
        position (str): what the owner conditions: 'embedding' or 'attention_input' (the first block's norm1
            output; CondSwinTransformer and CondViT only, the other owners refuse it). Default: 'embedding'.
        init_cfg (dict, optional): unused (no parameters); kept for the BaseModule interface.
        **options: the options of :class:`~condtok_mm.conditioning.ConditioningOptions`: ``mode`` ('sigma_max',
            'floor', 'graying', 'graying_dct'), ``alpha`` (1.0), ``target_kappa`` (2.0), ``detach`` (True),
            ``solver`` ('auto'), ``centred``, ``epsilon`` (the graying modes), ``check`` ('auto'), ``control``
            (None, 'scale_matched', 'norm_matched') and ``where``.
    """

    def __init__(self,
                 scope: str = 'image',
                 window_size: Optional[int] = None,
                 shift_size: int = 0,
                 position: str = 'embedding',
                 init_cfg: Optional[dict] = None,
                 **options):
        super().__init__(init_cfg=init_cfg)
        options = ConditioningOptions.resolve(None, type(self).__name__, options)
        self._hold(options, Placement(scope, window_size, shift_size, position, where=options.where))

    def _hold(self, options: ConditioningOptions, placement: Placement) -> None:
        """Keep ``options`` and ``placement`` once they are valid together (a new mode may not suit the scope)."""
        if placement.scope == 'window':
            options.check_window(placement.window_size, placement.shift_size)
        self.__dict__['options'] = options
        self.__dict__['placement'] = placement
        # the strength the batched path reads: one 0-dim CPU tensor, updated in place, so that a compiled
        # conditioner sees a new alpha without recompiling (a CUDA-graph capture keeps the value it was
        # captured with); not a buffer, so the state dict stays empty
        if '_alpha_value' not in self.__dict__:
            self.__dict__['_alpha_value'] = torch.zeros((), dtype=torch.float64)
        self.__dict__['_alpha_value'].fill_(float(options.alpha))
        self.__dict__['_forward_options'] = options.replace(alpha=self.__dict__['_alpha_value'])

    def __getattr__(self, name: str):
        held = self.__dict__
        if 'options' in held and name in ConditioningOptions.names():
            return getattr(held['options'], name)
        if 'placement' in held and name in Placement.names():
            return getattr(held['placement'], name)
        if name in RENAMED or name == 'location':
            raise _renamed_attribute(held['options'].where if 'options' in held else type(self).__name__, name)
        return super().__getattr__(name)

    def __setattr__(self, name: str, value) -> None:
        held = self.__dict__
        if 'options' not in held:
            super().__setattr__(name, value)
        elif name in RENAMED or name == 'location':
            raise _renamed_attribute(self.where, name)
        elif name == 'options':
            self._hold(value, dataclasses.replace(self.placement, where=value.where))
        elif name == 'placement':
            self._hold(self.options, dataclasses.replace(value, where=self.where))
        elif name == 'where':
            self._hold(self.options.replace(where=value), dataclasses.replace(self.placement, where=value))
        elif name in ConditioningOptions.names():
            self._hold(self.options.replace(**{name: value}), self.placement)
        elif name in Placement.names():
            self._hold(self.options, dataclasses.replace(self.placement, **{name: value}))
        else:
            super().__setattr__(name, value)

    def forward(self, tokens: torch.Tensor, hw_shape: Optional[Tuple[int, int]] = None,
                valid_shapes: Optional[Union[Sequence[Tuple[int, int]], torch.Tensor]] = None) -> torch.Tensor:
        """Condition tokens of shape (B, N, C).

        Args:
            tokens (Tensor): (B, N, C), one N x C matrix per image, row-major over the token grid.
            hw_shape (tuple[int, int], optional): the token grid (H, W) with H * W = N; needed by
                ``scope='window'``, ``mode='graying_dct'`` and ``valid_shapes``; with ``scope='image'`` it places
                the null-space completion on bands of whole token rows (see :mod:`condtok_mm.conditioning`).
            valid_shapes (Sequence[tuple[int, int]] or Tensor, optional): per image, the (h, w) top-left part
                of the grid that holds its valid (unpadded) tokens: non-negative integers, or an integer (B, 2)
                tensor (kept on the device; see :func:`condtok_mm.conditioning.condition_valid_regions`). Image i
                is conditioned as the matrix of those h * w tokens (window scope: windows cut to them, windows
                wholly outside pass unchanged); the other tokens are returned unchanged. None: every token is
                valid.
        """
        options = self.export_options() if torch.onnx.is_in_onnx_export() else self._forward_options
        placement, where = self.placement, options.where  # held attributes: read without __getattr__
        if hw_shape is None:
            if placement.scope == 'window':
                raise missing_grid(where, "scope='window'", tokens.shape)
            if valid_shapes is not None:
                raise missing_grid(where, 'valid_shapes', tokens.shape)
            return condition_tokens(tokens, options=options)
        grid = tokens_as_grid(tokens, hw_shape, where)
        if valid_shapes is not None:
            return condition_valid_regions(grid, valid_shapes, **placement.window, options=options).view(tokens.shape)
        if placement.scope == 'window':
            return condition_token_windows(tokens, hw_shape, **placement.window, options=options)
        return condition_tokens(grid, options=options).view(tokens.shape)

    def export_options(self) -> ConditioningOptions:
        """The forward options inside an ONNX export, or a RuntimeError naming the fix where the export would fail
        deep inside the model or compute another correction than this module does (:mod:`condtok_mm.deployment`
        asks every conditioner before it exports: torch's exporter retries a failed capture in other ways and
        then reports the operator it stopped at instead of this error).

        ONNX has no eigendecomposition or SVD operator: only mode='sigma_max' with solver='newton_schulz' (matrix
        products, a fixed number of steps) exports. check=False: an exported graph
        cannot raise from data, and reading the status back is a data-dependent host read that the exporter cannot
        trace; non-finite tokens come out non-finite from the graph instead of raising.
        """
        where = f'{self.where} (mode={self.mode!r}, solver={self.solver!r})'
        if torch.jit.is_tracing():
            raise RuntimeError(
                f'{where}: torch.onnx.export(..., dynamo=False), the TorchScript-based exporter, drops the in-place '
                "updates of a matrix diagonal that the Newton-Schulz solver makes, so its graph would compute another "
                'correction than this module; export with tools/deployment/export_onnx.py, or '
                'condtok_mm.deployment.export_onnx (torch.onnx.export with dynamo=True and the ONNX translations '
                'the conditioning needs)')
        if self.mode != 'sigma_max' or self.options.on_reference_path:
            raise RuntimeError(
                f'{where} cannot be exported to ONNX: ONNX has no eigendecomposition or SVD operator, and only '
                "mode='sigma_max' with solver='newton_schulz' (detach=True) computes the correction from matrix "
                "products (mode='floor' and the graying modes need the eigenvalues themselves). Options: "
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

    def extra_repr(self) -> str:
        options = [f'{name}={getattr(self.options, name)!r}' for name in ConditioningOptions.names()
                   if name != 'where' and (name != 'epsilon' or self.mode in GRAYING_MODES)]
        placement = [f'{name}={getattr(self.placement, name)!r}' for name in Placement.names()
                     if name not in ('window_size', 'shift_size') or self.scope == 'window']
        return ', '.join(options + placement)


def _renamed_attribute(where: str, name: str) -> AttributeError:
    """The error for an attribute that has another name now."""
    if name == 'location':
        return AttributeError(f'{where}: location is no longer an attribute of TokenConditioner; use where (the '
                              'name its errors start with, an option of ConditioningOptions)')
    return AttributeError(str(renamed_refusal(where, name)))
