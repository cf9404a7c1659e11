# Suite for tools/suites/run_suite.py: the demo Swin (synthetic shapes, 2 CPU cores) without conditioning and with
# each of the three conditioning methods at its published setting, every method at every learning rate and seed
# (its best learning rate is then compared with the baseline's, paired by seed).
#   conditioned embedded tokens (arXiv 2505.12789): C = s_1 U V^T on the embedded tokens, kappa <= 2
#   spectral conditioning of attention (arXiv 2603.07162): W_Q, W_K, W_V + lambda I, lambda = 10
#   Token Graying (arXiv 2505.01996), SVD form: X -> U (S / s_1)^eps V^T, eps = 0.95
# The demo study's seeds, learning rates and 4-epoch schedule, shared with the controls suites.
_base_ = ['./_base_/demo_4e.py']
description = ('Demo Swin Mask R-CNN (configs/demo/, data/shapes): baseline vs conditioned embedded tokens '
               "(sigma_max, kappa <= 2), spectral conditioning of attention (lambda 10) and Token Graying "
               '(epsilon 0.95), each at every learning rate.')
reference = 'baseline'
variants = dict(
    baseline=dict(config='configs/demo/mask-rcnn_swin-mini_fpn_12e_shapes.py',
                  description='no conditioning'),
    condtok=dict(config='configs/demo/mask-rcnn_swin-mini-condtok_fpn_12e_shapes.py',
                 description='conditioned embedded tokens: sigma_max, target kappa 2'),
    spectral=dict(config='configs/demo/mask-rcnn_swin-mini-spectral_fpn_12e_shapes.py',
                  description='spectral conditioning of attention: W_Q, W_K, W_V + 10 I'),
    graying=dict(config='configs/demo/mask-rcnn_swin-mini-graying_fpn_12e_shapes.py',
                 description='Token Graying (SVD form): epsilon 0.95'),
)
