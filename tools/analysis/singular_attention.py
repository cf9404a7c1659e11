"""How many attention windows of each layer are numerically singular in float32, per cell's checkpoint.

The command of :mod:`condtok_mm.analysis.singular_attention`, whose docstring gives its arguments and what it writes.
"""
from condtok_mm.analysis.singular_attention import main

if __name__ == '__main__':
    main()
