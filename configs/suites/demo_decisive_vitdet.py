# The decisive experiment, second architecture: the demo ViTDet Mask R-CNN (plain ViT, global + window
# attention) at the same 12-epoch schedule and 200 val images (12 epochs trained it to ~9 bbox AP in an earlier
# run), A baseline, B conditioned tokens, D norm-matched, each at its rate of the recorded sweep (A 2.5e-4, B and
# D 1e-3: configs/suites/demo_controls_vitdet.py), fixed in advance, on fresh seeds 3-5:
#   python tools/dataset/make_shapes.py --out-dir data/shapes_val200/ --num-val 200
#   python tools/suites/run_suite.py configs/suites/demo_decisive_vitdet.py --jobs 2 --resume
_base_ = ['./_base_/demo_12e_val200.py']
description = ('Demo ViTDet Mask R-CNN, 12 epochs, 200 val images: A baseline, B conditioned tokens, D '
               'norm-matched, at rates fixed in advance, seeds 3-5.')
seeds = [3, 4, 5]
reference = 'A_baseline'
family = ['B_conditioned', 'D_norm_matched']
_baseline = 'configs/demo/mask-rcnn_vit-mini-vitdet_simple-fpn_12e_shapes.py'
_conditioned = 'configs/demo/mask-rcnn_vit-mini-vitdet-condtok_simple-fpn_12e_shapes.py'
variants = dict(
    A_baseline=dict(config=_baseline, lrs=[2.5e-4], description='no conditioning'),
    B_conditioned=dict(config=_conditioned, lrs=[1e-3], description="X + C, mode='sigma_max', kappa <= 2"),
    D_norm_matched=dict(config=_conditioned, lrs=[1e-3],
                        cfg_options={'model.backbone.conditioning.control': 'norm_matched'},
                        description="(X + C) / r: kappa <= 2 at X's scale"),
)
