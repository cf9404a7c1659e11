"""condtok_mm: conditioned embedded tokens for OpenMMLab detectors.

Importing the package (``custom_imports=dict(imports=['condtok_mm'])`` in a config) only registers its modules;
it changes no function of mmengine or torch. The run-time fixes for the pinned stack are opt-in:
:mod:`condtok_mm.compat`.
"""
from . import datasets, engine, evaluation, models  # noqa: F401  (registration)
from .conditioning import condition_number, condition_tokens
from .version import __version__

__all__ = ['__version__', 'condition_tokens', 'condition_number']
