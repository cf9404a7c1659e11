"""FLOPs of a model with the conditioner counted: mmengine's FlopAnalyzer plus handles for the eigendecomposition
and the SVD, which it counts as 0 (it warns "Unsupported operator aten::linalg_eigh encountered" and moves on).

Counts follow mmengine's (fvcore's) convention: one multiply-add is one FLOP. The matrix products of the
conditioner (the Gram matrix X^T X, the correction X M, the null-space completion) are aten::matmul, which
mmengine counts already. For the decompositions the operation counts of Golub and Van Loan, Matrix
Computations (4th ed.), are used, halved to multiply-adds:

- ``baddbmm`` and ``baddbmm_`` (a batched product with an addend, the accumulation in place; mmengine has no
  handle for them): b n k m for (b, n, k) x (b, k, m);
- symmetric eigendecomposition of an n x n matrix, eigenvalues and eigenvectors (tridiagonalization and the
  symmetric QR algorithm, Sec. 8.3): 9 n^3 flops, so 4.5 n^3 multiply-adds;
- thin SVD of an m x n matrix (m >= n) with U1, S and V (Sec. 8.6, Table 8.6.1): the cheaper of
  Golub-Kahan-Reinsch, 14 m n^2 + 8 n^3, and R-SVD, 6 m n^2 + 20 n^3 flops; halved likewise.

LAPACK's divide-and-conquer drivers do fewer operations on large matrices, so these are upper estimates.
"""
import math
from typing import Any, Dict, List

import torch
from mmengine.analysis import FlopAnalyzer
from mmengine.analysis.jit_handles import get_shape

from condtok_mm.models.token_conditioner import TokenConditioner


def eigh_flop_jit(inputs: List[Any], outputs: List[Any]) -> int:
    """Multiply-adds of ``torch.linalg.eigh`` on a (..., n, n) matrix: 4.5 n^3 per matrix."""
    *batch, n, _ = get_shape(inputs[0])
    return int(math.prod(batch) * 4.5 * n**3)


def svd_flop_jit(inputs: List[Any], outputs: List[Any]) -> int:
    """Multiply-adds of a thin ``torch.linalg.svd`` of a (..., m, n) matrix with its singular vectors."""
    *batch, rows, cols = get_shape(inputs[0])
    m, n = max(rows, cols), min(rows, cols)
    return int(math.prod(batch) * min(14 * m * n**2 + 8 * n**3, 6 * m * n**2 + 20 * n**3) / 2)


def baddbmm_flop_jit(inputs: List[Any], outputs: List[Any]) -> int:
    """Multiply-adds of ``torch.baddbmm(input, batch1, batch2)``: those of batch1 @ batch2."""
    *batch, n, k = get_shape(inputs[1])
    return int(math.prod(batch) * n * k * get_shape(inputs[2])[-1])


DECOMPOSITION_HANDLES = {'aten::linalg_eigh': eigh_flop_jit, 'aten::linalg_svd': svd_flop_jit}
PRODUCT_HANDLES = {'aten::baddbmm': baddbmm_flop_jit, 'aten::baddbmm_': baddbmm_flop_jit}


def count_flops(model: torch.nn.Module, inputs: tuple) -> Dict[str, Any]:
    """Trace ``model(*inputs)`` and count its multiply-adds, the eigendecompositions and SVDs included.

    Returns:
        dict: ``total``; ``conditioner``: those of every TokenConditioner together (its matrix products and
        decompositions); ``decompositions``: those of every eigh and SVD in the model; ``by_module``: the
        totals of the top-level submodules (backbone, neck, heads).
    """
    analyzer = FlopAnalyzer(model, inputs)
    analyzer.set_op_handle(**DECOMPOSITION_HANDLES, **PRODUCT_HANDLES)
    analyzer.unsupported_ops_warnings(False)
    analyzer.uncalled_modules_warnings(False)
    by_module = analyzer.by_module()
    by_operator = analyzer.by_operator()
    conditioners = [name for name, module in model.named_modules() if isinstance(module, TokenConditioner)]
    return dict(
        total=analyzer.total(),
        conditioner=sum(by_module[name] for name in conditioners),
        decompositions=sum(by_operator.get(op.split('::')[1], 0) for op in DECOMPOSITION_HANDLES),
        by_module={name: by_module[name] for name, _ in model.named_children()})
