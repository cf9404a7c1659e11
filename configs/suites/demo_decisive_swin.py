# The decisive experiment on the demo Swin Mask R-CNN: at the demo's own 12-epoch schedule, where the
# conditioned model reaches ~21 bbox AP, does conditioning give a better final detector than the baseline at its
# better rate, and does the gain come through attention or through the residual stream?
#   A  baseline at 2.5e-4: chosen between 2.5e-4 and 1e-3 on seeds 0-2 (bbox AP at this schedule on these 200
#      images: 4.7 / 3.5 / 2.4, mean 3.5, against 1.8 / 6.8 / 1.5, mean 3.4; that selection run's cells are not
#      kept, docs/en/studies/records/demo_decisive_swin/README.md), so fixed here and reported on seeds 3-8, which
#      took no part in the choice
#   B  conditioned tokens (X + C, kappa <= 2), D  the same at X's token scale ((X + C) / r),
#   F_win  the first windowed attention's input conditioned per window (position='attention_input',
#      scope='window': kappa <= 2 on exactly what it multiplies, the residual stream untouched)
#   B, D and F_win at 1e-3, fixed in advance from the recorded sweep (configs/suites/demo_controls_swin.py).
# Primary endpoint: final bbox AP of B minus A, paired by seed on seeds 3-8, with its t interval and exact
# sign-flip p (Holm over B, D, F_win); secondary: AP at epochs 3 and 6, escape iterations.
# Cells run seed-major; stop it any time and continue with --resume:
#   python tools/dataset/make_shapes.py --out-dir data/shapes_val200/ --num-val 200
#   python tools/suites/run_suite.py configs/suites/demo_decisive_swin.py --jobs 2 --resume
_base_ = ['./_base_/demo_12e_val200.py']
description = ('Demo Swin Mask R-CNN, 12 epochs, 200 val images: A baseline (2.5e-4, chosen on seeds 0-2 '
               'between 2.5e-4 and 1e-3), B conditioned tokens, D norm-matched, F_win the first attention input '
               'conditioned per window; reported on seeds 3-8.')
seeds = [3, 4, 5, 6, 7, 8]
reference = 'A_baseline'
family = ['B_conditioned', 'D_norm_matched', 'F_win']
_baseline = 'configs/demo/mask-rcnn_swin-mini_fpn_12e_shapes.py'
_conditioned = 'configs/demo/mask-rcnn_swin-mini-condtok_fpn_12e_shapes.py'
variants = dict(
    A_baseline=dict(config=_baseline, lrs=[2.5e-4], description='no conditioning'),
    B_conditioned=dict(config=_conditioned, lrs=[1e-3], description="X + C, mode='sigma_max', kappa <= 2"),
    D_norm_matched=dict(config=_conditioned, lrs=[1e-3],
                        cfg_options={'model.backbone.conditioning.control': 'norm_matched'},
                        description="(X + C) / r: kappa <= 2 at X's scale"),
    F_win=dict(config=_conditioned, lrs=[1e-3],
               cfg_options={'model.backbone.conditioning.position': 'attention_input',
                            'model.backbone.conditioning.scope': 'window'},
               description="the first block's norm1 output conditioned per attention window"),
)
