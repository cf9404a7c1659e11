"""The bytes one conditioner call moves, in passes over the token matrix, and its peak extra memory.

The command of :mod:`condtok_mm.benchmark.byte_counts`, whose docstring gives its arguments and what it writes.
"""
from condtok_mm.benchmark.byte_counts import main

if __name__ == '__main__':
    main()
