"""Export a module holding TokenConditioners to ONNX, and switch their solver to the one that exports.

ONNX has no eigendecomposition or SVD operator. The batched conditioning path's Newton-Schulz solver
(``solver='newton_schulz'``, mode 'sigma_max') computes the correction from matrix products in a fixed number of
steps, chosen a priori (:func:`condtok_mm.conditioning.matrix_functions.newton_schulz_schedule`), so it needs no
convergence test and exports as a straight-line graph; its X + C agrees with eigh's within 1e-4
(tests/conditioning/test_conditioning_batched.py).

Shapes are static: the graph is traced at one input size. The token count fixes which branch of the batched path
runs (the two-pass chunks, the window stack, the short-side Gram matrix) and how many chunks are unrolled, so an
input of another size needs another export.
"""
import os
from typing import List, Sequence, Tuple

import torch

from condtok_mm.models.token_conditioner import TokenConditioner

from .onnx_translations import TRANSLATIONS

# The default opset of torch's exporter; onnxruntime 1.32 runs opsets up to 23.
OPSET = 18
EXPORT_SOLVER = 'newton_schulz'


def use_exportable_solver(model: torch.nn.Module) -> List[str]:
    """Set ``solver='newton_schulz'`` on every TokenConditioner of ``model`` whose solver is 'eigh' or 'auto' (eigh
    off CUDA), and return one message per conditioner switched, naming it.

    Raises:
        ValueError: for a conditioner whose mode or solver has no matrix-product form ('floor', the graying modes,
            the float64 reference: solver 'reference_gram' / 'reference_svd' or detach=False), naming it and the
            ways to deploy it.
    """
    messages = []
    for module in model.modules():
        if not isinstance(module, TokenConditioner):
            continue
        if module.mode != 'sigma_max' or module.options.on_reference_path:
            raise ValueError(
                f'{module.where} (mode={module.mode!r}, solver={module.solver!r}) cannot be exported to ONNX: '
                "only mode='sigma_max' on the batched path computes its correction from matrix products "
                "(solver='newton_schulz', detach=True); the other modes need the eigenvalues, which ONNX has no "
                'operator for. Deploy a TorchScript model (torch.jit.trace at the input size you deploy) or the '
                'baseline twin.')
        if module.solver != EXPORT_SOLVER:
            messages.append(f"{module.where}: solver={module.solver!r} -> {EXPORT_SOLVER!r} for the export (ONNX "
                            'has no eigendecomposition operator; Newton-Schulz gives the same X + C within 1e-4, '
                            'matrix products only)')
            module.solver = EXPORT_SOLVER
    return messages


def export_onnx(model: torch.nn.Module, inputs: Tuple[torch.Tensor, ...], path: str,
                input_names: Sequence[str], output_names: Sequence[str], opset: int = OPSET) -> str:
    """Export ``model`` (in eval mode, without gradients) called on ``inputs`` to the ONNX file ``path``, weights
    inside it, with torch's exporter and :data:`.onnx_translations.TRANSLATIONS`; returns ``path``.

    Args:
        model (nn.Module): the module; its TokenConditioners must use solver='newton_schulz'
            (:func:`use_exportable_solver`), or a RuntimeError names the first one and the fix before anything
            is traced.
        inputs (tuple[Tensor]): example inputs; their shapes are the graph's (static) input shapes.
        path (str): the .onnx file to write (its folder is created).
        input_names (Sequence[str]): one name per input.
        output_names (Sequence[str]): one name per output tensor, in the order the model returns them.
        opset (int): the ONNX opset. Default: OPSET.
    """
    for module in model.modules():
        if isinstance(module, TokenConditioner):
            module.export_options()  # raises, naming the conditioner and the fix, where it cannot export
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    model.eval()
    with torch.no_grad():
        torch.onnx.export(model, tuple(inputs), path, dynamo=True, custom_translation_table=TRANSLATIONS,
                          opset_version=opset, input_names=list(input_names), output_names=list(output_names),
                          external_data=False, verbose=False)
    return path
