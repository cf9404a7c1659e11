"""Run a study suite: every (variant, learning rate, seed) cell through tools/train.py and tools/test.py, then
gather the results.

The command of :mod:`condtok_mm.suites.run_suite`, whose docstring gives its arguments and what it writes. The
cells run this checkout's tools and import its condtok_mm, whatever package is installed; the runner stops, naming
the fix, where the condtok_mm it imports itself is another checkout's (condtok_mm.suites.launch).
"""
import os.path as osp

from condtok_mm.suites.run_suite import main

if __name__ == '__main__':
    main(root=osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))
