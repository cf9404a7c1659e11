"""condtok_mm: conditioned embedded tokens for OpenMMLab detectors.

Importing the package (``custom_imports=dict(imports=['condtok_mm'])`` in a config) only registers its modules;
it changes no function of mmengine or torch. The run-time fixes for the pinned stack are opt-in:
:mod:`condtok_mm.compat`.

Where mmengine is not installed at all (a GPU machine with only torch, for the conditioner's checks:
tools/benchmark/gpu_conditioner.sh) nothing is registered, since nothing there could read a registry, and the
pure-torch parts import on their own: :mod:`condtok_mm.conditioning` and the CUDA benchmark
(:mod:`condtok_mm.benchmark.conditioner_cuda`). An mmengine that is installed but fails to import still raises.
"""
import importlib.util

from .conditioning import condition_number, condition_tokens
from .version import __version__

if importlib.util.find_spec('mmengine') is not None:
    from . import datasets, engine, evaluation, models  # noqa: F401  (registration)

__all__ = ['__version__', 'condition_tokens', 'condition_number']
