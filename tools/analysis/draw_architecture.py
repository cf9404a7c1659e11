"""Draw where the token conditioner sits in the conditioned detectors (docs/en/index.md).

The command of :mod:`condtok_mm.analysis.draw_architecture`, whose docstring gives its arguments and what it writes.
"""
from condtok_mm.analysis.draw_architecture import main

if __name__ == '__main__':
    main()
