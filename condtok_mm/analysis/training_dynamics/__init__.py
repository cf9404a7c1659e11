"""Train named variants from the same seed and initial weights, and compare their training dynamics per block
(tools/analysis/compare_training_dynamics.py runs :func:`.compare.main`).

    variants    each variant's config (the tool's settings applied), its training in this process, the check that
                every variant starts from the reference's initial weights
    separation  the recorded curves, and where each variant separates from the reference, quantity by quantity
    figures     the curves per block, the global ones, and each variant's ratio to the reference as heatmaps
    compare     the command: its arguments, and the files it writes

It is not a suite (condtok_mm.suites): a suite compares the test metrics of whole training runs over seeds, each
cell a tools/train.py and tools/test.py process of its own, its initial weights implied by its seed. This compares
curves recorded every few iterations of short runs that are never tested, paired iteration by iteration against
one reference, and it checks what that pairing rests on: the variants are trained one after the other in one
process, and each one's state dict when training starts is compared with the reference's, key by key.
"""
