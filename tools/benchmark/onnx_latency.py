"""CPU latency of an exported conditioned backbone under onnxruntime, beside its twin and PyTorch.

The command of :mod:`condtok_mm.benchmark.onnx_latency`, whose docstring gives its arguments and what it writes.
"""
from condtok_mm.benchmark.onnx_latency import main

if __name__ == '__main__':
    main()
