"""Each image's valid (unpadded) region in a padded batch, handed from the data preprocessor to the conditioners.

mmdet pads every batch to a common size (bottom and right, ``pad_size_divisor``, batch augments such as LSJ's
fixed-size pad). The padded pixels become tokens, and so rows of the image's token matrix X: conditioned on
the whole padded grid, the correction an image gets would depend on the images that share its batch. The
conditioners therefore condition each image on the tokens of its own valid region only.

The backbone (and a neck) is called with the batch tensor alone, without the data samples that know each
image's ``img_shape``. :class:`ValidRegionDetDataPreprocessor` (mmdet's DetDataPreprocessor, unchanged)
records the valid sizes of the batch it returns; the conditioned modules look them up for the tensor they
receive. The record is tied to that batch tensor (a weak reference): a backbone accepts it only for the very
tensor the preprocessor returned, a neck (which sees features, not the batch) only while that batch is alive
and has its batch size. Without a record (mmpretrain classification, a bare tensor, another preprocessor)
every token counts as valid, which is exact for unpadded batches.
"""
import contextvars
import weakref
from typing import List, NamedTuple, Optional, Sequence, Tuple, Union

import torch
from mmdet.models.data_preprocessors import DetDataPreprocessor

from condtok_mm.registry import MODELS

__all__ = ['ValidRegionDetDataPreprocessor', 'BatchValidRegion', 'record_valid_region', 'batch_valid_region',
           'valid_token_shapes']


class BatchValidRegion(NamedTuple):
    """The valid pixel size (h, w) of every image of a padded (B, C, H, W) batch; images sit top-left."""
    batch: 'weakref.ref[torch.Tensor]'
    batch_hw: Tuple[int, int]
    img_shapes: Tuple[Tuple[int, int], ...]


_CURRENT: contextvars.ContextVar = contextvars.ContextVar('condtok_mm_batch_valid_region', default=None)


def record_valid_region(inputs: torch.Tensor, img_shapes: Sequence[Sequence[int]]) -> None:
    """Record that image ``i`` of the padded batch ``inputs`` (B, C, H, W) is valid in ``[:h_i, :w_i]``."""
    if inputs.dim() != 4 or len(img_shapes) != inputs.shape[0]:
        raise ValueError(f'record_valid_region: expected a (B, C, H, W) batch and B image shapes, got '
                         f'{tuple(inputs.shape)} and {len(img_shapes)} shapes')
    batch_hw = tuple(int(size) for size in inputs.shape[-2:])
    shapes = tuple((min(int(h), batch_hw[0]), min(int(w), batch_hw[1])) for h, w in
                   (shape[:2] for shape in img_shapes))
    _CURRENT.set(BatchValidRegion(weakref.ref(inputs), batch_hw, shapes))


def batch_valid_region(inputs: Optional[torch.Tensor] = None,
                       batch_size: Optional[int] = None) -> Optional[BatchValidRegion]:
    """The recorded valid region for ``inputs`` (that exact tensor), or, given only ``batch_size``, for the
    live batch of that size last recorded; None when there is none."""
    region = _CURRENT.get()
    if region is None:
        return None
    batch = region.batch()
    if batch is None:
        return None
    if inputs is not None:
        return region if batch is inputs else None
    return region if batch_size == len(region.img_shapes) else None


def valid_token_shapes(region: Optional[BatchValidRegion], grid_hw: Tuple[int, int],
                       stride: Union[int, Tuple[int, int], None] = None,
                       where: str = 'valid_token_shapes') -> Optional[List[Tuple[int, int]]]:
    """Each image's valid token grid (h_tok, w_tok) inside a (H_tok, W_tok) token grid of the batch.

    A token is valid when its patch holds a valid pixel: ``h_tok = ceil(h / stride)`` (at most H_tok), exact for
    patch embeddings and poolings that pad (Swin's corner padding: H_tok = ceil(H / stride)) or drop the last
    partial patch (ViTDet's convolution: floor).

    Args:
        region (BatchValidRegion, optional): the batch's valid pixel sizes; None: every token valid.
        grid_hw (tuple[int, int]): the token grid (H_tok, W_tok).
        stride (int or tuple[int, int], optional): pixels per token along (H, W), which the module that made the
            grid knows (its patch embedding's stride times each downsampling's). None: taken from the sizes where
            they tell it exactly: a side that is a multiple of its grid (H = H_tok * s, as with a
            ``pad_size_divisor`` that is a multiple of the stride), for both sides (square strides) where it
            also makes the other side's grid; with neither side a multiple it is refused, since a guess
            miscounts (a 130-pixel batch at stride 32 has 5 token rows, and round(130 / 5) = 26 would count the
            fifth valid for an image 120 pixels tall, whose pixels end in the fourth). Default: None.
        where (str): the name errors start with. Default: 'valid_token_shapes'.

    Returns:
        list[tuple[int, int]] or None: one (h_tok, w_tok) per image; None without a region or when every token
        is valid (nothing to exclude).

    Raises:
        ValueError: when ``stride`` does not make the grid from the batch (H_tok is neither ceil(H / s) nor
            floor(H / s)), or is None and the batch is not a multiple of the grid.
    """
    if region is None:
        return None
    grid = tuple(int(size) for size in grid_hw)  # tensors while torch.jit.trace records the sizes
    if stride is None:
        exact = [size // tokens for size, tokens in zip(region.batch_hw, grid) if size % tokens == 0]
        if not exact or not _makes_grid(region.batch_hw, grid, (exact[0], exact[0])):
            raise ValueError(
                f'{where}: the stride of a {grid} token grid cannot be told from its {region.batch_hw} batch, which '
                'is not a multiple of it; pad batches to a multiple of the stride (the data preprocessor\'s '
                'pad_size_divisor, e.g. 32), or condition where the backbone knows its stride '
                '(CondSwinTransformer, CondViT)')
        strides = (exact[0], exact[0])
    else:
        strides = (stride, stride) if isinstance(stride, int) else tuple(int(s) for s in stride)
        if not _makes_grid(region.batch_hw, grid, strides):
            raise ValueError(f'{where}: stride={stride!r} does not make a {grid} token grid from a '
                             f'{region.batch_hw} batch; use the stride of the module that made the grid')
    shapes = [tuple(min(tokens, -(-size // s)) for size, tokens, s in zip((h, w), grid, strides))
              for h, w in region.img_shapes]
    if all(shape == grid for shape in shapes):
        return None
    return shapes


def _makes_grid(batch_hw: Tuple[int, int], grid: Tuple[int, int], strides: Tuple[int, int]) -> bool:
    """Whether patches of ``strides`` pixels make the token ``grid`` from the batch: floor (the last partial
    patch dropped) or ceil (padded) on each side."""
    return all(tokens in (size // s, -(-size // s)) for size, tokens, s in zip(batch_hw, grid, strides))


@MODELS.register_module()
class ValidRegionDetDataPreprocessor(DetDataPreprocessor):
    """mmdet's :class:`DetDataPreprocessor` that also records each image's valid region for the conditioners.

    Everything it returns is exactly what DetDataPreprocessor returns (same arguments, same padding, same batch
    augments). After padding and batch augments it records, for the returned batch tensor, each image's
    ``img_shape`` (the resized image before any padding), so that :class:`TokenConditioner` in the backbone or
    neck conditions every image on its own valid tokens and not on its batch-mates' padding. Costs no pass
    over the image.

    Args:
        **kwargs: every argument of DetDataPreprocessor (mean, std, pad_size_divisor, pad_value, pad_mask,
            mask_pad_value, pad_seg, seg_pad_value, bgr_to_rgb, rgb_to_bgr, boxtype2tensor,
            non_blocking, batch_augments).
    """

    def forward(self, data: dict, training: bool = False) -> dict:
        data = super().forward(data, training)
        samples = data.get('data_samples')
        if samples is not None:
            record_valid_region(data['inputs'], [sample.metainfo['img_shape'] for sample in samples])
        return data
