"""κ of the tokens and of each attention layer per arm of a suite run's records.

The command of :mod:`condtok_mm.analysis.attention_kappa`, whose docstring gives its arguments and what it writes.
"""
from condtok_mm.analysis.attention_kappa import main

if __name__ == '__main__':
    main()
