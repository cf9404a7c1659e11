"""COCO evaluation time: FastCocoMetric against mmdet's CocoMetric, in 1 and 2 processes.

The command of :mod:`condtok_mm.benchmark.eval_speed`, whose docstring gives its arguments and what it writes.
"""
from condtok_mm.benchmark.eval_speed import main

if __name__ == '__main__':
    main()
