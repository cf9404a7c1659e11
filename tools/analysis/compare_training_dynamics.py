"""Train named variants from the same seed and initial weights, and compare their training dynamics per block.

The command of :mod:`condtok_mm.analysis.training_dynamics.compare`, whose docstring gives its arguments and what
it writes. It is kept apart from the study suites (tools/suites/run_suite.py), which compare the test metrics of
whole runs over seeds: this pairs curves recorded every few iterations of untested runs against one reference, and
checks, in one process, that every variant starts from the reference's initial weights
(condtok_mm/analysis/training_dynamics/__init__.py says more).
"""
from condtok_mm.analysis.training_dynamics.compare import main

if __name__ == '__main__':
    main()
