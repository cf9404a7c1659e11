"""Create the synthetic COCO-format shapes dataset of the demo configs and the tests.

The command of :mod:`condtok_mm.datasets.make_shapes`, whose docstring gives its arguments and what it writes.
"""
from condtok_mm.datasets.make_shapes import main

if __name__ == '__main__':
    main()
