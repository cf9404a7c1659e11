# The protocol study at the demo scale: what conditioning does to a backbone pretrained without it, a ramp,
# norm-matching, and conditioned pretraining (tools/suites/run_suite.py). The demo mini-Swin is pretrained on
# the shapes classification task (its own images) with and without conditioning, then the demo Mask R-CNN is
# fine-tuned on the detection data for the demo's own 12 epochs (600 iterations; warm-up 100) under each protocol,
# evaluated on 200 val images as the decisive study is (_base_/demo_12e_val200.py):
#   python tools/dataset/make_shapes.py --out-dir data/shapes_val200/ --num-val 200   # detection data (seed 0)
#   python tools/dataset/make_shapes.py --out-dir data/shapes_cls/ --seed 1 --num-train 10000 --num-val 500
#   python tools/train.py configs/demo/swin-mini_1xb32-20e_shapes-cls.py          # P0/P1's pretraining
#   python tools/train.py configs/demo/swin-mini-condtok_1xb32-20e_shapes-cls.py  # P2's pretraining
#   python tools/suites/run_suite.py configs/suites/demo_protocols_swin.py --jobs 2 --resume
# The suite reads the backbones published into its records (below); others: CONDTOK_PRETRAINED=PATH (unconditioned)
# and CONDTOK_PRETRAINED_CONDITIONED=PATH in the environment of run_suite.py (mmengine's {{$VAR:default}}
# substitution), e.g. work_dirs/swin-mini_1xb32-20e_shapes-cls/epoch_20.pth after the commands above.
# Every arm fine-tunes from a loaded backbone, so with the same seed every arm starts from the same neck and head
# weights (tests/suites/test_protocol_suites.py checks it); the from-scratch reference draws its backbone's random
# initialisation first, so its heads differ from the other arms': it is described, not compared.
#
# Declared before any cell ran:
# - Gate: the study runs only from an unconditioned backbone whose val accuracy on the shapes classification task is
#   above the majority class's share by more than two standard errors (41.0 % of the 500 val images: >= 45.4 %).
#   Below that, P0 and P1 would start from a backbone that learned the label prior only.
# - Primary endpoint: final bbox AP of P1_drop_in - P0_baseline, paired by seed, exact sign-flip p, uncorrected
#   (outside the family); it asks what switching conditioning on under unconditioned pretrained weights does.
# - Family (Holm): P1_ramp - P1_drop_in and P1_norm - P1_drop_in (do the remedies change the drop-in), and
#   P2_conditioned_pretraining - P0_baseline (the conditioned pipeline against the unconditioned one). Eight reported
#   seeds, so that the smallest Holm-adjusted p over three is 3 x 2/2^8 = 0.023, where six stopped at 0.094.
# - Rates: P0, P1 and P2 each choose between 2.5e-4 and 1e-3 (the from-scratch baseline's and the conditioned
#   demo's, a factor 4 apart) on seeds 0-1 and are reported on seeds 3-10; P1_ramp and P1_norm take P1's rate, so that
#   their difference from P1 is the remedy alone. The from-scratch reference runs at the conditioned demo's 1e-3.
# - Loss spike: the mean training loss over iterations 1-100 (the warm-up, over which the ramp rises) of every
#   iteration's logged loss, paired like the AP (suite.md's early-loss table; loss.png's right panel), uncorrected.
# 12 selection and 48 reported cells.
_base_ = ['./_base_/demo_12e_val200.py']
description = ('Demo Swin Mask R-CNN, 12 epochs, 200 val images, fine-tuned from a mini-Swin pretrained on shapes '
               'classification: P0 unconditioned pretraining and fine-tuning, P1 drop-in conditioning, P1-ramp '
               '(strength 0 -> 1 over the first 100 iterations), P1-norm (norm-matched), P2 conditioned pretraining '
               'and fine-tuning; and the conditioned demo from scratch, described.')
reference = 'P0_baseline'
family = ['P1_ramp', 'P1_norm', 'P2_conditioned_pretraining']
selection_seeds = [0, 1]
seeds = [3, 4, 5, 6, 7, 8, 9, 10]
lrs = [2.5e-4, 1e-3]
early_loss = 100
# every iteration's loss is logged unsmoothed (below), so the escape rule smooths over 50 of them: about the
# 50-iteration running mean the decisive study's logged losses carried
escape = dict(window=50)
cfg_options = {
    # the loss of every iteration, unsmoothed, in scalars.json: the early-loss endpoint and the loss curves
    'default_hooks.logger.interval': 1,
    'log_processor.window_size': 1,
}
# the two backbones as pretrained for this study (the configs above) and published into its records, so
# that every cell, on any machine, reads the same files (their SHA-256 is in each cell's fingerprint)
_unconditioned = '{{$CONDTOK_PRETRAINED:docs/en/studies/records/demo_protocols_swin/pretrained/swin-mini_1xb32-20e_shapes-cls-43b2bc03.pth}}'
_conditioned = '{{$CONDTOK_PRETRAINED_CONDITIONED:docs/en/studies/records/demo_protocols_swin/pretrained/swin-mini-condtok_1xb32-20e_shapes-cls-f20e8f05.pth}}'
_demo = 'configs/demo/mask-rcnn_swin-mini'
variants = dict(
    P0_baseline=dict(config=f'{_demo}-pretrained_fpn_12e_shapes.py',
                     cfg_options={'model.backbone.init_cfg.checkpoint': _unconditioned},
                     description='unconditioned pretraining, unconditioned fine-tuning'),
    P1_drop_in=dict(config=f'{_demo}-condtok-pretrained_fpn_12e_shapes.py',
                    cfg_options={'model.backbone.init_cfg.checkpoint': _unconditioned},
                    description='unconditioned pretraining, conditioned fine-tuning from iteration 0'),
    P1_ramp=dict(config=f'{_demo}-condtok-pretrained-ramp_fpn_12e_shapes.py', lrs=dict(best_of='P1_drop_in'),
                 reference='P1_drop_in', cfg_options={'model.backbone.init_cfg.checkpoint': _unconditioned},
                 description='P1 with the strength ramped linearly 0 -> 1 over the first 100 iterations'),
    P1_norm=dict(config=f'{_demo}-condtok-pretrained-norm_fpn_12e_shapes.py', lrs=dict(best_of='P1_drop_in'),
                 reference='P1_drop_in', cfg_options={'model.backbone.init_cfg.checkpoint': _unconditioned},
                 description="P1 with control='norm_matched': (X + C) / r, kappa <= 2 at X's scale"),
    P2_conditioned_pretraining=dict(config=f'{_demo}-condtok-condpretrained_fpn_12e_shapes.py',
                                    cfg_options={'model.backbone.init_cfg.checkpoint': _conditioned},
                                    description='conditioned pretraining, conditioned fine-tuning'),
    scratch_conditioned=dict(config=f'{_demo}-condtok_fpn_12e_shapes.py', lrs=[1e-3], reference=None,
                             description='the conditioned demo from scratch (no pretraining), described'),
)
