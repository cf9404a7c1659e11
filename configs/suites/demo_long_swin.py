# Better detector or faster start: the decisive Swin study (demo_decisive_swin.py) read at three times its budget.
# At 12 epochs the baseline has barely left its loss plateau (AP 0.5 at epoch 6, 2.7 at epoch 12, its rate decayed
# at epoch 9), so a 12-epoch gap may measure how fast training gets going rather than the detector it ends with.
# Here every arm trains the demo Swin Mask R-CNN for 36 epochs (1800 iterations at 4 images a batch on the 200
# training images; warm-up 100 iterations, x0.1 after epochs 27 and 33), validated every 6 epochs on the 200 val
# images, a checkpoint each epoch so that an interrupted cell resumes, the attention-conditioning hook every 100
# iterations (and at the first). The data and the command (seed-major; stop any time, go on with --resume):
#   python tools/dataset/make_shapes.py --out-dir data/shapes_val200/ --num-val 200
#   python tools/suites/run_suite.py configs/suites/demo_long_swin.py --jobs 2 --resume
#
# Declared before any cell ran:
# - Arms: A the baseline at 2.5e-4 and at 1e-3 (one variant with both rates, so that a baseline that only needed
#   time cannot lose by its rate), B conditioned tokens (X + C, kappa <= 2) at 1e-3, D norm-matched ((X + C) / r) at
#   1e-3; B's and D's rate is the one the 12-epoch studies fixed in advance, not tuned here. The same seed gives
#   every arm the same initial weights (the conditioner has no parameters). Seeds 3-8: 24 cells.
# - Primary endpoint: epoch-36 bbox AP (tools/test.py on the final checkpoint) of B minus A at A's better rate by
#   mean over the reported seeds themselves: a choice biased toward the baseline, so a win survives it. Paired by
#   seed, 95 % t interval, exact two-sided sign-flip p (floor 2/2^6 = 0.031), uncorrected.
# - Secondary, described with the same statistics, uncorrected: D - A (the gain at X's token scale), and the gap at
#   every validation (epochs 6, 12, 18, 24, 30, 36: the curve of the gap over training).
# - Convergence gate: an arm converged if its mean bbox AP change from epoch 30 to epoch 36 (the validations during
#   training on the reported seeds; the epoch-36 one evaluates the same checkpoint on the same images as the test)
#   is below 1 AP in size. An arm that fails it is reported as still budget-limited at 36 epochs, not as converged.
# - Decision rule, on the primary endpoint's interval [lo, hi], applied in this order (the first that holds):
#   1. "a better final detector":  lo > 0 and exact p <= 0.05 (with 6 seeds that is every seed positive, p 0.031),
#      the chosen A converged; its size is stated, and whether B passed the gate;
#   2. "B ahead at 36 epochs, the baseline still rising: the final detector not resolved":  lo > 0 and exact
#      p <= 0.05, the chosen A not converged;
#   3. "a faster start, not a better final detector":  hi < 2, the chosen A and B both converged (the 12-epoch gap
#      of +16.4 closes to less than 2 AP; "and the baseline ends ahead" where hi < 0);
#   4. "not resolved":  anything else (B still rising counts here for 3).
#   2 AP is the smallest gap a user would act on: the size of the protocol study's resolved effects (-2.2, +2.0),
#   and at least the noise floor of one cell (the same cell on another kind of CPU or after a change of the
#   conditioner's numerics moved by up to 1.9 AP; at one commit on one kind of CPU it reruns bit-identically:
#   docs/en/studies/repeatability.md); no reading goes below it. A's rate is picked by its epoch-36 test bbox AP on
#   the reported seeds; that favours A, so reading 1 is the conservative one and reading 3 the less certain one.
#   The 12-epoch study stays beside this one as the early-budget result.
# Amended after an independent review of the design, before the rule was applied (4 cells, seed 3, had finished;
# A's two seed-3 test values had been seen while checking the run, no B or D value): the readings ordered (1 and 3
# overlapped for 0 < lo < hi < 2), the gate taken in size (a drop of 1 AP or more is not converged either),
# reading 3 asks B to have converged too, the 2 AP named from the protocol study and the repeatability floor, the
# rate choice's metric stated. The schedule, arms, seeds and endpoints are as first declared.
_base_ = ['./_base_/demo_12e_val200.py']
description = ('Demo Swin Mask R-CNN, 36 epochs (1800 iterations, x0.1 after epochs 27 and 33), 200 val images, '
               'validated every 6 epochs: A baseline at 2.5e-4 and 1e-3 (reported at its better rate by mean on the '
               'reported seeds), B conditioned tokens and D norm-matched at 1e-3; seeds 3-8.')
seeds = [3, 4, 5, 6, 7, 8]
reference = 'A_baseline'
_baseline = 'configs/demo/mask-rcnn_swin-mini_fpn_12e_shapes.py'
_conditioned = 'configs/demo/mask-rcnn_swin-mini-condtok_fpn_12e_shapes.py'
variants = dict(
    A_baseline=dict(config=_baseline, lrs=[2.5e-4, 1e-3], description='no conditioning, at its better rate'),
    B_conditioned=dict(config=_conditioned, lrs=[1e-3], description="X + C, mode='sigma_max', kappa <= 2"),
    D_norm_matched=dict(config=_conditioned, lrs=[1e-3],
                        cfg_options={'model.backbone.conditioning.control': 'norm_matched'},
                        description="(X + C) / r: kappa <= 2 at X's scale"),
)
_epochs = 36
cfg_options = {
    'train_cfg.max_epochs': _epochs,
    'train_cfg.val_interval': 6,
    'train_cfg.dynamic_intervals': None,
    'param_scheduler.1.end': _epochs,
    'param_scheduler.1.milestones': [27, 33],
    'custom_hooks.0.interval': 100,  # AttentionConditioningHook: kappa at iteration 1 and every 100 after it
}
