"""ONNX export of conditioned backbones (needs the ``deploy`` extra: onnx, onnxscript, onnxruntime).

Not imported by ``import condtok_mm``: importing it pulls in onnxscript. :func:`export_onnx` runs torch's ONNX
exporter (``dynamo=True``) with the translations the conditioning needs (:mod:`.onnx_translations`);
:func:`use_exportable_solver` switches every conditioner to the solver that exports; :func:`run_onnxruntime` runs an
exported graph on the CPU; :mod:`.export_tool` is the command of tools/deployment/export_onnx.py. See
docs/en/user_guides/deployment.md.
"""
from .export import OPSET, export_onnx, use_exportable_solver
from .runtime import run_onnxruntime

__all__ = ['OPSET', 'export_onnx', 'use_exportable_solver', 'run_onnxruntime']
