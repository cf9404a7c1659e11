"""The benchmark suites' parts, shared by tools/benchmark/run_suite.py (which runs a suite) and
tools/analysis/dose_response.py (which reads a finished one).

    schema      a suite file read into typed Suite / Variant, config paths resolved; SuiteError
    plan        the cells of a suite (Cell), seed-major, each with its options and final checkpoint
    launch      the train and test commands of a cell under each launcher, and running them
    results     what a cell's files say: its state, metrics, loss and kappa curves
    statistics  means over seeds, paired differences with t intervals, the best rate of a variant
    report      the markdown tables and the JSON summary
    plots       the figures (imports matplotlib when called)

Not imported by ``condtok_mm`` itself: importing the package registers its modules and does nothing else.
"""
