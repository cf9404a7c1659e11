# The controls study on the demo Swin Mask R-CNN: does conditioning help, or the token scale it brings?
#   python tools/suites/run_suite.py configs/suites/demo_controls_swin.py --jobs 2
_base_ = ['./_base_/demo_4e.py']
description = ('Demo Swin Mask R-CNN (configs/demo/, data/shapes): A baseline, B conditioned tokens (the '
               "paper's sigma_max, kappa <= 2), C scale-matched (r X), D norm-matched ((X + C) / r), "
               "E B with scope='window', F B at the first attention's input; E and F at B's best rate.")
reference = 'A_baseline'
_baseline = 'configs/demo/mask-rcnn_swin-mini_fpn_12e_shapes.py'
_conditioned = 'configs/demo/mask-rcnn_swin-mini-condtok_fpn_12e_shapes.py'
variants = dict(
    A_baseline=dict(config=_baseline, lrs=[1e-4, 2.5e-4, 5e-4, 1e-3, 2e-3], description='no conditioning'),
    B_conditioned=dict(config=_conditioned, description="X + C, mode='sigma_max', kappa <= 2"),
    C_scale_matched=dict(config=_conditioned, cfg_options={'model.backbone.conditioning.control': 'scale_matched'},
                         description='r X: the conditioned token scale, kappa of X'),
    D_norm_matched=dict(config=_conditioned, cfg_options={'model.backbone.conditioning.control': 'norm_matched'},
                        description="(X + C) / r: kappa <= 2 at X's scale"),
    E_window=dict(config=_conditioned, cfg_options={'model.backbone.conditioning.scope': 'window'},
                  lrs=dict(best_of='B_conditioned'), description='B per attention window'),
    F_attention_input=dict(config=_conditioned,
                           cfg_options={'model.backbone.conditioning.position': 'attention_input'},
                           lrs=dict(best_of='B_conditioned'),
                           description="B on the first block's norm1 output (what attention multiplies)"),
)
