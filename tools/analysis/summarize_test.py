"""The COCO metrics of the newest tools/test.py run in a work dir.

The command of :mod:`condtok_mm.analysis.summarize_test`, whose docstring gives its arguments and what it writes.
"""
from condtok_mm.analysis.summarize_test import main

if __name__ == '__main__':
    main()
