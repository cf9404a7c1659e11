"""The study suites' parts, shared by tools/suites/run_suite.py (which runs a suite) and
tools/analysis/dose_response.py (which reads a finished one).

    schema       a suite file read into typed Suite / Variant / EscapeRule, config paths resolved; SuiteError
    plan         the cells of a suite (Cell), seed-major, per phase and stage (selection seeds, reported
                 seeds), each with its options, final checkpoint and warm-up; each variant's chosen rate
    fingerprint  what defines a cell, recorded when it starts and compared when it is reused
    launch       the train and test commands of a cell under each launcher, with its checkout's condtok_mm;
                 running them in process groups that an interrupted runner stops
    results      what a cell's files say: its state, metrics, loss, kappa and validation curves, plateau escape
    statistics   means, paired differences (t interval, exact sign-flip p), Holm, the best rate on given seeds
    tables       the report's rows: per seed set, variant and rate; each variant at its chosen rate
    report       the markdown tables and the JSON summary
    plots       the figures (imports matplotlib when called)
    run_suite    the runner's command (tools/suites/run_suite.py): every cell run or gathered, the report written
    save_suite_records  a run's finished cells copied without checkpoints (tools/suites/save_suite_records.py)
    confirmatory  a pre-registered study's declared rule (one per suite file: demo_confirm_swin, neon_trees_swin)
                 applied to its records: the readings, the convergence gate, the CPU kinds
                 (tools/analysis/confirmatory_answer.py)

Not imported by ``condtok_mm`` itself: importing the package registers its modules and does nothing else.
"""
