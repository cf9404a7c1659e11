"""TokenConditioner on padded token batches beside its float64 floor, on the CPU or a CUDA device.

The command of :mod:`condtok_mm.benchmark.conditioner_cost`, whose docstring gives its arguments and what it writes.
"""
from condtok_mm.benchmark.conditioner_cost import main

if __name__ == '__main__':
    main()
