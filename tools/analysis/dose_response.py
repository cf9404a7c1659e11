"""AP against each method's strength, from a finished suite run.

The command of :mod:`condtok_mm.analysis.dose_response`, whose docstring gives its arguments and what it writes.
"""
from condtok_mm.analysis.dose_response import main

if __name__ == '__main__':
    main()
