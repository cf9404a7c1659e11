"""The token scale r = ||X + C||_F / ||X||_F of each dose of the conditioning on val images.

The command of :mod:`condtok_mm.analysis.measure_token_scale`, whose docstring gives its arguments and what it writes.
"""
from condtok_mm.analysis.measure_token_scale import main

if __name__ == '__main__':
    main()
