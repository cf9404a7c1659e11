"""A pre-registered study's answer from its records, by the rule its suite file declared (--suite NAME).

The command of :mod:`condtok_mm.analysis.confirmatory_answer`, whose docstring gives its arguments and what it writes.
"""
from condtok_mm.analysis.confirmatory_answer import main

if __name__ == '__main__':
    main()
