"""Export a config's conditioned backbone to ONNX, and check onnxruntime against PyTorch.

The command of :mod:`condtok_mm.deployment.export_tool`, whose docstring gives its arguments and what it writes.
"""
from condtok_mm.deployment.export_tool import main

if __name__ == '__main__':
    main()
