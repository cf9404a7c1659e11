"""Create the NEON tree-crown dataset (configs/neon/) from the deepforest 2.1.0 wheel.

The command of :mod:`condtok_mm.datasets.make_neon_trees`, whose docstring gives its arguments and what it writes.
"""
from condtok_mm.datasets.make_neon_trees import main

if __name__ == '__main__':
    main()
