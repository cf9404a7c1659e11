"""Spectral conditioning of attention: the query, key and value projections shifted by lambda * I.

Pure PyTorch, no OpenMMLab imports. Reference: H. Saratchandran and S. Lucey, spectral conditioning of
attention, arXiv 2603.07162 (the follow-up of "Enhancing Transformers Through Conditioned Embedded Tokens").

Every attention layer computes q = W_q x, k = W_k x, v = W_v x (plus biases) from its input tokens x (d
channels). Spectral conditioning replaces each of the three d x d matrices W by W + lambda I, a fixed,
parameter-free shift (lambda = 10 in the paper) that moves the singular values of W away from zero:

    (W + lambda I) x + b = (W x + b) + lambda x.

It is applied in the forward, to the projection's output, and never written into the weights: a checkpoint
trained without it loads unchanged, and the state dict of a model that uses it holds the raw W (the shift is
part of the architecture, like a residual connection, not of the parameters). lambda = 0 is the plain model.

Fused projections: one Linear d -> k d computes the stacked blocks [W_1 x; ...; W_k x] (k = 3 for ``qkv``,
2 for ``kv``); each block is a square W_j and gets its own lambda I, i.e. lambda [x; ...; x] is added. Heads
are contiguous slices of each block (mmdet's Swin, mmpretrain's attention modules and ViTDet all reshape the
output as (k, heads, head_dim)), so head h's query projection becomes W_q^h + lambda [0 ... I ... 0]: each
head's block is shifted by lambda times the identity on its own channels.
"""
from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn as nn

__all__ = ['add_scaled_identity', 'attention_projections', 'PROJECTION_BLOCKS']

# Names of the query/key/value projections inside an attention module and how many square blocks each stacks.
PROJECTION_BLOCKS = {'qkv': 3, 'kv': 2, 'q': 1, 'k': 1, 'v': 1}
# The sets of projections that make a module an attention layer: a fused qkv, or separate ones.
_ATTENTION_LAYOUTS = (('qkv', ), ('q', 'kv'), ('q', 'k', 'v'))


def add_scaled_identity(projected: torch.Tensor, x: torch.Tensor, lam: float) -> torch.Tensor:
    """(W + lambda I) x for every square block of a projection, from its output ``projected`` = W x.

    Args:
        projected (Tensor): the projection's output (..., k * d): k stacked blocks of d channels.
        x (Tensor): its input (..., d).
        lam (float): lambda.

    Returns:
        Tensor: ``projected`` + lambda [x; ...; x], same shape.
    """
    channels = x.shape[-1]
    blocks = projected.shape[-1] // channels
    return (projected.unflatten(-1, (blocks, channels)) + lam * x.unsqueeze(-2)).flatten(-2)


def attention_projections(model: nn.Module, targets: Optional[Sequence[str]] = None,
                          where: str = 'attention_projections') -> List[Tuple[str, nn.Linear]]:
    """(name, Linear) of the query/key/value projections of the attention layers of ``model``.

    An attention layer is a module whose children include ``nn.Linear`` projections named as one of
    ``qkv``; ``q`` and ``kv``; or ``q``, ``k`` and ``v`` (mmdet's Swin WindowMSA, mmpretrain's
    MultiheadAttention, WindowMSA, XCA and class attention, ViTDet's attention).

    Args:
        model (nn.Module): the model to search.
        targets (Sequence[str], optional): names (as in ``model.named_modules()``) of the attention modules
            to use; None: every attention layer found.
        where (str): a name for error messages.

    Raises:
        ValueError: when no attention layer is found, a target is not one, or a projection is not made of
            square blocks (then W + lambda I is undefined).
    """
    layers = {}
    for name, module in model.named_modules():
        children = dict(module.named_children())
        for layout in _ATTENTION_LAYOUTS:
            if all(isinstance(children.get(projection), nn.Linear) for projection in layout):
                layers[name] = [(projection, children[projection]) for projection in layout]
                break
    if targets is not None:
        missing = [target for target in targets if target not in layers]
        if missing:
            raise ValueError(f'{where}: {", ".join(map(repr, missing))} is not an attention module with qkv, '
                             f'q/kv or q/k/v Linear projections; the attention modules are '
                             f'{", ".join(map(repr, layers)) or "none"}')
        layers = {target: layers[target] for target in targets}
    if not layers:
        raise ValueError(f'{where}: found no attention module in {type(model).__name__} (a module with nn.Linear '
                         "children named 'qkv', 'q' and 'kv', or 'q', 'k' and 'v'); spectral conditioning "
                         'needs the query/key/value projections as nn.Linear layers')
    found = []
    for name, projections in layers.items():
        for projection, linear in projections:
            blocks = PROJECTION_BLOCKS[projection]
            full_name = f'{name}.{projection}' if name else projection
            if linear.out_features != blocks * linear.in_features:
                raise ValueError(
                    f'{where}: {full_name} maps {linear.in_features} -> {linear.out_features} channels, not '
                    f'{blocks} x {linear.in_features}: its {blocks} block(s) are not square, so W + lambda I is '
                    f'undefined; leave this attention module out by listing the others in `targets`')
            found.append((full_name, linear))
    return found
