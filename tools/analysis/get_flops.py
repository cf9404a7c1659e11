"""FLOPs of detectors and classifiers with the token conditioner counted.

The command of :mod:`condtok_mm.analysis.get_flops`, whose docstring gives its arguments and what it writes.
"""
from condtok_mm.analysis.get_flops import main

if __name__ == '__main__':
    main()
