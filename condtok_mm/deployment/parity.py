"""Parity of an exported graph with the module it came from: onnxruntime's outputs against PyTorch's float32
forward, next to PyTorch's own float32 error (its float32 forward against its float64 forward).

The second number is the scale the first is judged on. A conditioned backbone's float32 features can carry an error
of their own that the unconditioned twin's do not: on the untrained Swin demo backbone, PyTorch's float32 features
are 2e-4 to 3e-4 of the largest one from their float64 values from stage 1 on (the twin's: 4e-7; with
``centred=True``, which keeps C off the all-ones channel vector that the next LayerNorm removes, also 5e-7). Two
float32 runtimes then differ by about that much too.
"""
import copy
from typing import List, NamedTuple

import numpy as np
import torch

from .runtime import run_onnxruntime

# onnxruntime against PyTorch (float32), relative to the largest feature: at most this, or at most
# FLOAT32_ERROR_FACTOR times PyTorch's own float32 error where that is larger (two float32 runs, each about that
# far from the float64 forward).
FEATURE_TOLERANCE = 1e-5
FLOAT32_ERROR_FACTOR = 3


class OutputParity(NamedTuple):
    """One output's largest differences, relative to its largest PyTorch float32 value."""
    shape: tuple
    onnxruntime_vs_pytorch: float
    float32_vs_float64: float

    @property
    def tolerance(self) -> float:
        return max(FEATURE_TOLERANCE, FLOAT32_ERROR_FACTOR * self.float32_vs_float64)

    @property
    def within_tolerance(self) -> bool:
        return self.onnxruntime_vs_pytorch <= self.tolerance


def _as_list(outputs) -> List[torch.Tensor]:
    return list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]


def output_parity(module: torch.nn.Module, path: str, inputs: dict) -> List[OutputParity]:
    """Run ``module`` (float32, eval mode) and the ONNX graph ``path`` exported from it on ``inputs`` (input name ->
    float32 tensor, in the module's argument order), and a float64 copy of the module; one :class:`OutputParity` per
    output."""
    tensors = list(inputs.values())
    with torch.no_grad():
        expected = _as_list(module(*tensors))
        reference = _as_list(copy.deepcopy(module).double()(*(t.double() for t in tensors)))
    actual = run_onnxruntime(path, {name: t.numpy() for name, t in inputs.items()}, threads=1)
    parity = []
    for got, want, exact in zip(actual, expected, reference):
        scale = max(float(want.abs().max()), 1e-30)
        parity.append(OutputParity(tuple(want.shape), float(np.abs(got - want.numpy()).max()) / scale,
                                   float((want.double() - exact).abs().max()) / scale))
    return parity
