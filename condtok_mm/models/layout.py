"""Where things sit in the backbones we know: attention modules, transformer blocks, patch embeddings, the modules that cut attention windows.

The one place that reads the attribute names of mmdet's and mmpretrain's Swin (``stages[i].blocks[j]``, a
``ShiftWindowMSA`` around its ``WindowMSA`` ``w_msa``), ViTDet's ViT (``blocks[j]`` with ``window_size``) and
mmpretrain's attention modules; the spectral wrapper, the attention-conditioning probe and the
training-dynamics hook ask it instead of looking themselves. It looks through a wrapper's ``wrapped`` module
(CondTokBackbone, SpectralAttentionBackbone). Pure PyTorch.

Which module cuts a backbone's attention windows is found here (:func:`window_owners`); how they are cut is
:mod:`condtok_mm.models.attention_windows`.
"""
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn

__all__ = [
    'unwrapped', 'PROJECTION_BLOCKS', 'attention_projections', 'find_attention_modules', 'block_norms',
    'find_residual_blocks', 'first_attention_blocks', 'block_token_grid', 'patch_embedding',
    'output_token_grid', 'patch_embedding_tokens', 'output_layout', 'conditioner_stage', 'window_owners',
    'owner_windows'
]

# Names of the query/key/value projections inside an attention module and how many square blocks each stacks.
PROJECTION_BLOCKS = {'qkv': 3, 'kv': 2, 'q': 1, 'k': 1, 'v': 1}
# The sets of projections that make a module an attention layer: a fused qkv, or separate ones.
_ATTENTION_LAYOUTS = (('qkv', ), ('q', 'kv'), ('q', 'k', 'v'))
# The two norms of a pre-norm transformer block: mmdet/mmpretrain Swin and ViTDet name them norm1/norm2,
# mmpretrain's ViT layers ln1/ln2.
NORM_NAMES = (('norm1', 'norm2'), ('ln1', 'ln2'))


def unwrapped(model: nn.Module) -> nn.Module:
    """The module a TransparentWrapper (CondTokBackbone, SpectralAttentionBackbone) wraps, else ``model``."""
    return getattr(model, 'wrapped', model)


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


def find_attention_modules(backbone: nn.Module) -> List[Tuple[str, nn.Module]]:
    """Attention modules whose probabilities and heads can be read: a ``softmax`` nn.Softmax module, a ``qkv``
    Linear producing q, k, v (in that order) and an output projection ``proj`` (mmdet's and mmpretrain's
    Swin WindowMSA, ViTDet's attention)."""
    return [(name, module) for name, module in backbone.named_modules()
            if isinstance(getattr(module, 'softmax', None), nn.Softmax)
            and isinstance(getattr(module, 'qkv', None), nn.Linear)
            and isinstance(getattr(module, 'proj', None), nn.Linear)]


def block_norms(module: nn.Module) -> Optional[Tuple[nn.Module, nn.Module]]:
    """The (first, second) norm of a pre-norm transformer block (norm1/norm2 or ln1/ln2), or None."""
    for first, second in NORM_NAMES:
        norm1, norm2 = getattr(module, first, None), getattr(module, second, None)
        if isinstance(norm1, nn.Module) and isinstance(norm2, nn.Module):
            return norm1, norm2
    return None


def find_residual_blocks(backbone: nn.Module) -> List[Tuple[str, nn.Module]]:
    """(name, block) of the pre-norm transformer blocks of a backbone, in forward order: the modules with two
    norms (:func:`block_norms`) that hold exactly one attention module (:func:`find_attention_modules`);
    exactly one, because Swin's backbone itself has output norms named norm1 and norm2. Names are module
    paths without a wrapper's ``wrapped.`` prefix (e.g. ``stages.0.blocks.1``, ``blocks.3``)."""
    attention_names = [name for name, _ in find_attention_modules(backbone)]
    blocks = []
    for name, module in backbone.named_modules():
        if name and block_norms(module) is not None \
                and sum(attention.startswith(name + '.') for attention in attention_names) == 1:
            blocks.append((name, module))
    return [(name[len('wrapped.'):] if name.startswith('wrapped.') else name, block) for name, block in blocks]


def first_attention_blocks(backbone: nn.Module) -> Dict[int, Tuple[nn.Module, int, int]]:
    """{stage: (first block, window_size, shift_size)} of the backbones whose layout we know: Swin's
    ``stages[i].blocks[0]`` (mmdet, mmpretrain; its attention's windows), ViTDet's ``blocks[0]`` (stage 0;
    window 0 = global attention)."""
    backbone = unwrapped(backbone)
    stages = getattr(backbone, 'stages', None)
    if stages is not None and all(hasattr(stage, 'blocks') for stage in stages):
        found = {}
        for index, stage in enumerate(stages):
            block = stage.blocks[0]
            attention = getattr(block, 'attn', None)
            if hasattr(block, 'norm1') and hasattr(attention, 'window_size'):
                found[index] = (block, attention.window_size, getattr(attention, 'shift_size', 0))
        return found
    blocks = getattr(backbone, 'blocks', None)
    if blocks is not None and len(blocks) and hasattr(blocks[0], 'norm1') \
            and isinstance(getattr(blocks[0], 'window_size', None), int):
        return {0: (blocks[0], blocks[0].window_size, 0)}
    return {}


def block_token_grid(args: tuple) -> Tuple[int, int]:
    """The (H, W) token grid of a block of :func:`first_attention_blocks` from its forward arguments: Swin's
    blocks get (tokens, hw_shape), ViTDet's a (B, H, W, C) grid."""
    return tuple(args[1]) if len(args) > 1 else tuple(args[0].shape[1:3])


def patch_embedding(backbone: nn.Module) -> Optional[nn.Module]:
    """The ``patch_embed`` module of a backbone (mmdet, mmpretrain, ViTDet), or None."""
    return getattr(unwrapped(backbone), 'patch_embed', None)


def output_token_grid(output: tuple) -> Optional[Tuple[int, int]]:
    """The (H, W) of a (tokens, hw_shape, ...) output, as mmdet's and mmpretrain's PatchEmbed return; None
    when its second element is not a grid."""
    if len(output) > 1 and isinstance(output[1], (tuple, list, torch.Size)) and len(output[1]) == 2 \
            and all(isinstance(v, int) for v in output[1]):
        return tuple(output[1])
    return None


# The (B, H, W, C) outputs among the modules whose 4-D output layout this file knows (by class name, through
# subclasses): ViTDet's patch embedding is channel-last. A convolution's output is (B, C, H, W).
CHANNEL_LAST_OUTPUTS = ('ViTDetPatchEmbed', )


def output_layout(module: nn.Module, tokens: torch.Tensor, location: str) -> str:
    """The layout of ``module``'s output tensor ``tokens`` as token_layout='auto' reads it: 'BNC' for 3-D tokens;
    for a 4-D output the layout of the modules this file knows (:data:`CHANNEL_LAST_OUTPUTS` 'BHWC', a
    convolution 'BCHW'). Any other 4-D output could be either, and raises naming the layouts."""
    if tokens.dim() == 3:
        return 'BNC'
    if tokens.dim() != 4:
        raise ValueError(f'{location}: cannot read a {tokens.dim()}-D tensor of shape {tuple(tokens.shape)} as '
                         "tokens; expected (B, N, C), (B, C, H, W) or (B, H, W, C)")
    if any(cls.__name__ in CHANNEL_LAST_OUTPUTS for cls in type(module).__mro__):
        return 'BHWC'
    if isinstance(module, nn.modules.conv._ConvNd):
        return 'BCHW'
    raise ValueError(f"{location}: token_layout='auto' cannot tell whether the {type(module).__name__} output of "
                     f"shape {tuple(tokens.shape)} is (B, C, H, W) or (B, H, W, C); give token_layout='BCHW' or "
                     "'BHWC' ('auto' knows 3-D (B, N, C) tokens, convolutions' (B, C, H, W) and "
                     f"{', '.join(CHANNEL_LAST_OUTPUTS)}'s (B, H, W, C))")


def patch_embedding_tokens(output) -> Tuple[torch.Tensor, Optional[Tuple[int, int]]]:
    """The (B, N, C) tokens and (H, W) grid (None where unknown) of a patch embedding's output: ViTDet's
    (B, H, W, C) grid, mmdet's and mmpretrain's (tokens, hw_shape), or bare (B, N, C) tokens."""
    tokens = output[0] if isinstance(output, (tuple, list)) else output
    if tokens.dim() == 4:  # (B, H, W, C), ViTDet's patch embedding
        hw_shape = tuple(tokens.shape[1:3])
    elif isinstance(output, (tuple, list)):  # (tokens, hw_shape)
        hw_shape = output_token_grid(output)
    else:
        hw_shape = None
    return tokens.reshape(tokens.shape[0], -1, tokens.shape[-1]), hw_shape


def conditioner_stage(name: str) -> int:
    """The stage a conditioner conditions, from its module name: CondSwinTransformer's ``conditioners.2`` -> 2;
    a single conditioner (CondViT's ``conditioner``, CondTokBackbone's ``conditioners.<target>.conditioner``)
    conditions stage 0."""
    last = name.rsplit('.', 1)[-1]
    return int(last) if last.isdigit() else 0


def window_owners(backbone: nn.Module, attentions: Sequence[nn.Module]) -> List[Tuple[int, nn.Module]]:
    """(index in ``attentions``, owner) for each attention module whose windows we know how to read: the
    owner is the module whose forward cuts them (see :func:`owner_windows`), Swin's ShiftWindowMSA around
    its WindowMSA ``w_msa``, or ViTDet's block around its ``attn``."""
    index_of = {id(attention): index for index, attention in enumerate(attentions)}
    owners = []
    for module in backbone.modules():
        owned = getattr(module, 'w_msa', None)  # Swin's ShiftWindowMSA around its WindowMSA
        if id(owned) in index_of:
            owners.append((index_of[id(owned)], module))
        owned = getattr(module, 'attn', None)  # ViTDet's block around its attention
        if id(owned) in index_of and isinstance(getattr(module, 'window_size', None), int) \
                and not hasattr(owned, 'w_msa'):
            owners.append((index_of[id(owned)], module))
    return owners


def owner_windows(owner: nn.Module, args: tuple) -> Tuple[int, Tuple[int, int], int, int]:
    """(batch, (H, W) token grid, window_size, shift_size) of the attention windows that a
    :func:`window_owners` owner cuts, from its forward arguments; window_size 0 is global attention."""
    if hasattr(owner, 'w_msa'):  # Swin's ShiftWindowMSA(query (B, H * W, C), hw_shape)
        return args[0].shape[0], tuple(args[1]), owner.window_size, owner.shift_size
    grid = args[0]  # ViTDet's block((B, H, W, C)); its windows are never shifted
    return grid.shape[0], tuple(grid.shape[1:3]), owner.window_size, 0
