"""condtok_mm: conditioned embedded tokens for OpenMMLab detectors.

Importing the package (``custom_imports=dict(imports=['condtok_mm'])`` in a config) registers its modules
and applies the run-time fixes of :mod:`condtok_mm.compat`.
"""
from . import compat
from .version import __version__

compat.apply()

from . import datasets, engine, evaluation, models  # noqa: E402,F401  (registration)
from .conditioning import condition_number, condition_tokens  # noqa: E402

__all__ = ['__version__', 'condition_tokens', 'condition_number']
