"""κ of the embedded tokens and of every attention layer on a config's val images.

The command of :mod:`condtok_mm.analysis.measure_conditioning`, whose docstring gives its arguments and what it writes.
"""
from condtok_mm.analysis.measure_conditioning import main

if __name__ == '__main__':
    main()
