"""Keep a suite run's records: copy what tools/suites/run_suite.py reads of each finished cell (its fingerprint,

The command of :mod:`condtok_mm.suites.save_suite_records`, whose docstring gives its arguments and what it writes.
"""
from condtok_mm.suites.save_suite_records import main

if __name__ == '__main__':
    main()
