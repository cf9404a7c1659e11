"""Where a conditioner acts: its placement (scope, window, position), checked once, and the one builder that the
four modules owning a conditioner (CondSwinTransformer, CondViT, CondTokBackbone, CondTokNeck) share.

A placement is part of the conditioning config (``conditioning=dict(type='TokenConditioner', scope='window',
position='attention_input')``, the keys a study sets as ``model.backbone.conditioning.scope``); the conditioner holds
it as a :class:`Placement` and the owner acts on it. An owner that cannot honour a placement refuses it when it is
built (:func:`build_conditioner`), naming what it supports, instead of conditioning something else.
"""
import dataclasses
from collections.abc import Mapping
from typing import Callable, Optional, Sequence, Tuple

import torch.nn as nn

from condtok_mm.registry import MODELS

__all__ = ['CONDITIONING_SCOPES', 'CONDITIONING_POSITIONS', 'TOKEN_LAYOUTS', 'Placement', 'build_conditioner',
           'check_token_layout', 'missing_grid']

CONDITIONING_SCOPES = ('image', 'window')
CONDITIONING_POSITIONS = ('embedding', 'attention_input')
# How an owner reads the tensors it conditions: (B, N, C) tokens, channel-last or channel-first feature maps.
TOKEN_LAYOUTS = ('BNC', 'BHWC', 'BCHW')


def _one_of(values) -> str:
    return 'one of ' + ', '.join(repr(value) for value in values)


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where a conditioner acts, checked when it is made (in the options' wording, named ``where``).

    Args:
        scope (str): 'image' (one N x C matrix per image, the paper's construction) or 'window' (one matrix per
            attention window: a windowed-attention block only ever multiplies the tokens of one window with each
            other). Default: 'image'.
        window_size (int, optional): side of the attention window, with ``scope='window'`` only (checked with the
            options: :meth:`condtok_mm.conditioning.ConditioningOptions.check_window`). An owner that knows its
            first attention block fills it in when the config leaves it out. Default: None.
        shift_size (int): Swin's window shift, 0 <= shift_size < window_size, ``scope='window'`` only. Swin's
            first block of every stage is unshifted, so conditioning a stage input uses 0. Default: 0.
        position (str): what the owner conditions. 'embedding': the tokens it is given, i.e. the embedded tokens
            X before the first block (the paper), a stage's input, a target's output or a neck's input.
            'attention_input': the first block's norm1 output, leaving the residual stream and the token scale
            untouched (CondSwinTransformer and CondViT only); with ``scope='window'`` each attention window of it
            is conditioned, so kappa <= target_kappa holds on exactly what a windowed attention multiplies.
            Default: 'embedding'.
        where (str): the name errors start with. Not part of the placement: two placements that differ only
            here compare equal. Default: 'TokenConditioner'.
    """

    scope: str = 'image'
    window_size: Optional[int] = None
    shift_size: int = 0
    position: str = 'embedding'
    where: str = dataclasses.field(default='TokenConditioner', compare=False)

    def __post_init__(self):
        if self.position not in CONDITIONING_POSITIONS:
            raise ValueError(f'{self.where}: position={self.position!r} is invalid; use '
                             f'{_one_of(CONDITIONING_POSITIONS)}')
        if self.scope not in CONDITIONING_SCOPES:
            raise ValueError(f'{self.where}: scope={self.scope!r} is invalid; use {_one_of(CONDITIONING_SCOPES)}')
        if self.scope == 'image' and (self.window_size is not None or self.shift_size != 0):
            raise ValueError(f'{self.where}: window_size={self.window_size!r} and shift_size={self.shift_size!r} are '
                             "invalid with scope='image' (it conditions the whole image); use them with "
                             "scope='window'")

    @classmethod
    def names(cls) -> tuple:
        """The placement's argument names, ``where`` left out (a constant, so that a compiled forward reads it)."""
        return PLACEMENT_NAMES

    @property
    def window(self) -> dict:
        """``window_size`` and ``shift_size`` as keyword arguments of the functional API; empty for whole images."""
        return dict(window_size=self.window_size, shift_size=self.shift_size) if self.scope == 'window' else {}


PLACEMENT_NAMES = tuple(field.name for field in dataclasses.fields(Placement) if field.name != 'where')


def missing_grid(where: str, needs: str, shape=None) -> ValueError:
    """The error for (B, N, C) tokens (of ``shape``, where known) that come without the (H, W) grid that ``needs``
    needs."""
    tokens = '(B, N, C) tokens' + (f' {tuple(shape)}' if shape is not None else '')
    return ValueError(f'{where}: {needs} needs the token grid, and {tokens} come without an (H, W): call the '
                      'conditioner with hw_shape=(H, W), or in CondTokBackbone or CondTokNeck condition a feature map '
                      "(token_layout 'BHWC' or 'BCHW') or a (tokens, hw_shape) output such as mmdet's and "
                      "mmpretrain's PatchEmbed")


def check_token_layout(layout, where: str, auto: bool) -> str:
    """``layout`` when it is one of :data:`TOKEN_LAYOUTS` (or 'auto' where the owner reads it from the module);
    else a ValueError naming the valid ones."""
    valid = (('auto', ) if auto else ()) + TOKEN_LAYOUTS
    if layout not in valid:
        raise ValueError(f'{where}: token_layout={layout!r} is invalid; use {_one_of(valid)}')
    return layout


# The attention window an owner passes for a first block that attends globally.
GLOBAL_ATTENTION = (0, 0)


def build_conditioner(conditioning: Mapping, where: str, positions: Sequence[str], unsupported: str = '',
                      attention_window: Optional[Tuple[int, int]] = None, token_grid: bool = True,
                      name: Optional[Callable[[str], str]] = None) -> nn.Module:
    """Build the conditioner of ``conditioning`` for an owner, and refuse a placement the owner cannot honour.

    Args:
        conditioning (Mapping): the conditioner config, e.g. ``dict(type='TokenConditioner', scope='window')``.
        where (str): where it sits, the name its errors start with, e.g. 'CondSwinTransformer stage 0'.
        positions (Sequence[str]): the positions the owner honours.
        unsupported (str): why the other positions are not honoured and what to do instead, for the refusal.
        attention_window (tuple[int, int], optional): (window_size, shift_size) of the attention block the
            conditioned tokens feed, where the owner knows it: a per-window conditioner whose config leaves them
            out takes the block's, and one that names others is refused; (0, 0) (:data:`GLOBAL_ATTENTION`) for a
            block that attends globally, where ``scope='window'`` is refused. None: the owner does not know its
            blocks (the config must give window_size). Default: None.
        token_grid (bool): whether the owner can give the conditioner the token grid; False refuses
            ``scope='window'``, which needs it. Default: True.
        name (Callable[[str], str], optional): the conditioner's name from its position, where that changes it
            (e.g. CondViT's 'patch embedding' and 'block 0 attention input'). None: ``where``. Default: None.

    Returns:
        nn.Module: the conditioner, named ``where`` (or ``name(position)``) in its errors.

    Raises:
        ValueError: naming the conditioner, the placement and what the owner supports.
    """
    cfg = dict(conditioning, where=where)
    windowed = cfg.get('scope') == 'window'
    if windowed and attention_window == GLOBAL_ATTENTION:
        raise ValueError(f"{where}: scope='window' but the attention block it feeds attends globally (no windows); "
                         "use scope='image'")
    if windowed and attention_window is not None:
        cfg.setdefault('window_size', attention_window[0])
        cfg.setdefault('shift_size', attention_window[1])
    conditioner = MODELS.build(cfg)
    placement = conditioner.placement
    if placement.position not in positions:
        raise ValueError(f'{where}: position={placement.position!r} is invalid; use {_one_of(positions)}'
                         + (f' ({unsupported})' if unsupported else ''))
    if placement.scope == 'window' and not token_grid:
        raise missing_grid(where, "scope='window'")
    if windowed and attention_window is not None:
        own = (placement.window_size, placement.shift_size)
        if own != tuple(attention_window):
            raise ValueError(
                f'{where}: per-window conditioning uses window_size={own[0]}, shift_size={own[1]} but the attention '
                f'block it feeds uses window_size={attention_window[0]}, shift_size={attention_window[1]}; leave '
                "window_size and shift_size out of the conditioning config to take the block's own")
    if name is not None:
        conditioner.where = name(placement.position)
    return conditioner
