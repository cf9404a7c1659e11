"""Per-window against whole-image conditioning of embedded tokens.

The command of :mod:`condtok_mm.benchmark.window_conditioning`, whose docstring gives its arguments and what it writes.
"""
from condtok_mm.benchmark.window_conditioning import main

if __name__ == '__main__':
    main()
