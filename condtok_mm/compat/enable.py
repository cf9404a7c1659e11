"""Importing this module applies condtok_mm's run-time fixes (:func:`condtok_mm.compat.apply`).

It exists for configs, which can import modules but not call functions::

    custom_imports = dict(imports=['condtok_mm', 'condtok_mm.compat.enable'], allow_failed_imports=False)

``custom_imports=dict(imports=['condtok_mm'])`` alone only registers condtok_mm's modules.
"""
from . import apply

apply()
