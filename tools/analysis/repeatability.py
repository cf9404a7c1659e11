"""How far two runs of the same cell differ: weights, test metrics and curves.

The command of :mod:`condtok_mm.analysis.repeatability`, whose docstring gives its arguments and what it writes.
"""
from condtok_mm.analysis.repeatability import main

if __name__ == '__main__':
    main()
