"""Tree-crown detectors' predictions drawn on a NEON photograph beside its ground truth.

The command of :mod:`condtok_mm.analysis.neon_predictions`, whose docstring gives its arguments and what it writes.
"""
from condtok_mm.analysis.neon_predictions import main

if __name__ == '__main__':
    main()
