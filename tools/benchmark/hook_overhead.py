"""AttentionKappaHook's recording against a training step, per interval.

The command of :mod:`condtok_mm.benchmark.hook_overhead`, whose docstring gives its arguments and what it writes.
"""
from condtok_mm.benchmark.hook_overhead import main

if __name__ == '__main__':
    main()
