"""Training-step and inference time and peak memory of baseline vs conditioned detectors.

The command of :mod:`condtok_mm.benchmark.overhead`, whose docstring gives its arguments and what it writes.
"""
from condtok_mm.benchmark.overhead import main

if __name__ == '__main__':
    main()
