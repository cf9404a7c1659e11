# Suite for tools/suites/run_suite.py: the demo ViTDet (synthetic shapes, 2 CPU cores) without conditioning and with
# each of the three conditioning methods at its published setting, each at its best learning rate of the demo Swin
# (configs/suites/demo_methods_swin.py, by mean bbox AP over 3 seeds: baseline 2.5e-4, conditioned tokens 1e-3,
# spectral 5e-4, graying 2e-3), as the controls study does for its ViTDet: a full rate sweep costs 3 hours here.
#   conditioned embedded tokens (arXiv 2505.12789): C = s_1 U V^T on the embedded tokens, kappa <= 2
#   spectral conditioning of attention (arXiv 2603.07162): W_Q, W_K, W_V + lambda I, lambda = 10
#   Token Graying (arXiv 2505.01996), SVD form: X -> U (S / s_1)^eps V^T, eps = 0.95
# The demo study's seeds and 4-epoch schedule, shared with the controls suites. The baseline and conditioned cells
# are those of demo_controls_vitdet.py (the same configs, rates and options), linked in:
#   mkdir -p work_dirs/suites/demo_methods_vitdet
#   ln -s ../demo_controls_vitdet/A_baseline work_dirs/suites/demo_methods_vitdet/baseline
#   ln -s ../demo_controls_vitdet/B_conditioned work_dirs/suites/demo_methods_vitdet/condtok
#   python tools/suites/run_suite.py configs/suites/demo_methods_vitdet.py --jobs 2 --resume
_base_ = ['./_base_/demo_4e.py']
description = ('Demo ViTDet Mask R-CNN (configs/demo/, data/shapes): baseline vs conditioned embedded tokens '
               "(sigma_max, kappa <= 2), spectral conditioning of attention (lambda 10) and Token Graying "
               '(epsilon 0.95), each at its best learning rate on the demo Swin.')
reference = 'baseline'
variants = dict(
    baseline=dict(config='configs/demo/mask-rcnn_vit-mini-vitdet_simple-fpn_12e_shapes.py',
                  lrs=[2.5e-4], description='no conditioning'),
    condtok=dict(config='configs/demo/mask-rcnn_vit-mini-vitdet-condtok_simple-fpn_12e_shapes.py',
                 lrs=[1e-3], description='conditioned embedded tokens: sigma_max, target kappa 2'),
    spectral=dict(config='configs/demo/mask-rcnn_vit-mini-vitdet-spectral_simple-fpn_12e_shapes.py',
                  lrs=[5e-4], description='spectral conditioning of attention: W_Q, W_K, W_V + 10 I'),
    graying=dict(config='configs/demo/mask-rcnn_vit-mini-vitdet-graying_simple-fpn_12e_shapes.py',
                 lrs=[2e-3], description='Token Graying (SVD form): epsilon 0.95'),
)
