"""Plot κ over training from the AttentionKappaHook scalars of one or more runs.

The command of :mod:`condtok_mm.analysis.plot_conditioning`, whose docstring gives its arguments and what it writes.
"""
from condtok_mm.analysis.plot_conditioning import main

if __name__ == '__main__':
    main()
