"""ONNX translations of the two aten operators that the batched conditioning path reaches and torch's ONNX exporter
(``torch.onnx.export(..., dynamo=True)``) cannot translate; handed to it as ``custom_translation_table``.

- ``aten::diagonal_scatter``: the functional form of the in-place updates of a diagonal in the Newton-Schulz step
  (:func:`condtok_mm.conditioning.matrix_functions._step_matrix`). Without a translation the exporter decomposes it
  into an in-place copy that fails its own functional-graph check ("aot_autograd expected to have an entirely
  functional graph, but found prims.copy_to"); with one it is kept whole and written as
  ``A * (1 - I) + src I``, I the identity mask of A's last two axes (offset 0 on those axes: the only form the
  conditioning uses; others are refused).
- ``aten::searchsorted`` (the band edges of :class:`condtok_mm.conditioning.batched._Bands`): ONNX has no search
  operator. For a sorted ``s`` (..., L) and values ``v`` (..., K) the insertion point is the number of entries of
  ``s`` before ``v``: ``sum_l [s_l <= v_k]`` (``right=True``) or ``sum_l [s_l < v_k]``, one comparison of a
  (..., K, L) tensor and a ReduceSum: O(K L) instead of O(K log L), at most (d + 1) x L booleans per token matrix
  (3 MB at ViTDet-B's 64 x 64 x 768).
"""
import onnx_ir as ir
import torch
from onnxscript import opset18 as op


def diagonal_scatter(self, src, offset: int = 0, dim1: int = 0, dim2: int = 1):
    """``self`` with its diagonal over the last two axes replaced by ``src`` (offset 0 only)."""
    rank = None if self.shape is None else len(self.shape)
    last_two = {dim1, dim2} == {-2, -1} or (rank is not None and {dim1 % rank, dim2 % rank} == {rank - 2, rank - 1})
    if offset != 0 or not last_two:
        raise NotImplementedError(f'diagonal_scatter(offset={offset}, dim1={dim1}, dim2={dim2}): only the main '
                                  'diagonal of the last two axes is translated')
    zeros = op.ConstantOfShape(op.Shape(self, start=-2), value=ir.tensor([0], dtype=self.dtype))
    eye = op.EyeLike(zeros)
    off_diagonal = op.Sub(op.CastLike(op.Constant(value_float=1.0), self), eye)
    return op.Add(op.Mul(self, off_diagonal), op.Mul(op.Unsqueeze(src, op.Constant(value_ints=[-1])), eye))


def searchsorted(sorted_sequence, self, out_int32: bool = False, right: bool = False, side=None, sorter=None):
    """The insertion points of ``self`` in ``sorted_sequence`` along the last axis, as a count (see the module)."""
    if sorter is not None:
        raise NotImplementedError('searchsorted with a sorter argument is not translated')
    sequence = op.Unsqueeze(sorted_sequence, op.Constant(value_ints=[-2]))  # (..., 1, L)
    points = op.Unsqueeze(self, op.Constant(value_ints=[-1]))  # (..., K, 1)
    before = op.LessOrEqual(sequence, points) if right or side == 'right' else op.Less(sequence, points)
    count = op.ReduceSum(op.Cast(before, to=ir.DataType.INT64), op.Constant(value_ints=[-1]), keepdims=0)
    return op.Cast(count, to=ir.DataType.INT32) if out_int32 else count


TRANSLATIONS = {torch.ops.aten.diagonal_scatter.default: diagonal_scatter,
                torch.ops.aten.searchsorted.Tensor: searchsorted}
