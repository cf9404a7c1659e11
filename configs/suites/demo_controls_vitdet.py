# The controls study, second architecture: the demo ViTDet Mask R-CNN (plain ViT, global + window attention, the
# paper's main setting), variants A-D of demo_controls_swin.py, each at its best learning rate there (by mean
# bbox AP over 3 seeds: A 2.5e-4, B 1e-3, C 2.5e-4, D 1e-3; work_dirs/suites/demo_controls_swin/suite.md).
#   python tools/suites/run_suite.py configs/suites/demo_controls_vitdet.py --jobs 2
_base_ = ['./_base_/demo_4e.py']
description = ('Demo ViTDet Mask R-CNN (configs/demo/, data/shapes): A baseline, B conditioned tokens, C '
               'scale-matched, D norm-matched, each at its best learning rate of the Swin study '
               '(configs/suites/demo_controls_swin.py).')
reference = 'A_baseline'
_baseline = 'configs/demo/mask-rcnn_vit-mini-vitdet_simple-fpn_12e_shapes.py'
_conditioned = 'configs/demo/mask-rcnn_vit-mini-vitdet-condtok_simple-fpn_12e_shapes.py'
variants = dict(
    A_baseline=dict(config=_baseline, lrs=[2.5e-4], description='no conditioning'),
    B_conditioned=dict(config=_conditioned, lrs=[1e-3], description="X + C, mode='sigma_max', kappa <= 2"),
    C_scale_matched=dict(config=_conditioned, lrs=[2.5e-4],
                         cfg_options={'model.backbone.conditioning.control': 'scale_matched'},
                         description='r X: the conditioned token scale, kappa of X'),
    D_norm_matched=dict(config=_conditioned, lrs=[1e-3],
                        cfg_options={'model.backbone.conditioning.control': 'norm_matched'},
                        description="(X + C) / r: kappa <= 2 at X's scale"),
)
