# Suite for tools/benchmark/run_suite.py: dose-response of each conditioning method's strength on the demo Swin
# (synthetic shapes, 2 CPU cores). The baseline is run at every learning rate; each dose at the baseline's best
# learning rate only (best_of='baseline'), so that the curves differ in the strength alone. Four strengths per method:
#   conditioned embedded tokens: target kappa 2 (the paper), 8, 32, 128 (weaker as it grows)
#   spectral conditioning of attention: lambda 1, 3, 10 (the paper), 30 (stronger as it grows)
#   Token Graying: epsilon 0.3, 0.6, 0.8, 0.95 (the authors' default; stronger as it falls, kappa -> kappa^eps;
#   their sweep peaks at 0.6-0.7)
# The demo study's seeds, learning rates and 4-epoch schedule, shared with the controls suites.
_base_ = ['./_base_/demo_4e.py']
description = ('Demo Swin Mask R-CNN (configs/demo/, data/shapes): dose-response of conditioned tokens '
               '(target kappa), spectral conditioning (lambda) and Token Graying (epsilon) at the '
               "baseline's best learning rate.")
reference = 'baseline'
variants = dict(
    baseline=dict(config='configs/demo/mask-rcnn_swin-mini_fpn_12e_shapes.py', description='no conditioning'),
    condtok_k2=dict(
        config='configs/demo/mask-rcnn_swin-mini-condtok_fpn_12e_shapes.py',
        lrs=dict(best_of='baseline'),
        cfg_options={'model.backbone.conditioning.target_kappa': 2.0},
        description='conditioned embedded tokens, target kappa 2'),
    condtok_k8=dict(
        config='configs/demo/mask-rcnn_swin-mini-condtok_fpn_12e_shapes.py',
        lrs=dict(best_of='baseline'),
        cfg_options={'model.backbone.conditioning.target_kappa': 8.0},
        description='conditioned embedded tokens, target kappa 8'),
    condtok_k32=dict(
        config='configs/demo/mask-rcnn_swin-mini-condtok_fpn_12e_shapes.py',
        lrs=dict(best_of='baseline'),
        cfg_options={'model.backbone.conditioning.target_kappa': 32.0},
        description='conditioned embedded tokens, target kappa 32'),
    condtok_k128=dict(
        config='configs/demo/mask-rcnn_swin-mini-condtok_fpn_12e_shapes.py',
        lrs=dict(best_of='baseline'),
        cfg_options={'model.backbone.conditioning.target_kappa': 128.0},
        description='conditioned embedded tokens, target kappa 128'),
    spectral_l1=dict(
        config='configs/demo/mask-rcnn_swin-mini-spectral_fpn_12e_shapes.py',
        lrs=dict(best_of='baseline'),
        cfg_options={'model.backbone.lam': 1.0},
        description='spectral conditioning of attention, lambda 1'),
    spectral_l3=dict(
        config='configs/demo/mask-rcnn_swin-mini-spectral_fpn_12e_shapes.py',
        lrs=dict(best_of='baseline'),
        cfg_options={'model.backbone.lam': 3.0},
        description='spectral conditioning of attention, lambda 3'),
    spectral_l10=dict(
        config='configs/demo/mask-rcnn_swin-mini-spectral_fpn_12e_shapes.py',
        lrs=dict(best_of='baseline'),
        cfg_options={'model.backbone.lam': 10.0},
        description='spectral conditioning of attention, lambda 10'),
    spectral_l30=dict(
        config='configs/demo/mask-rcnn_swin-mini-spectral_fpn_12e_shapes.py',
        lrs=dict(best_of='baseline'),
        cfg_options={'model.backbone.lam': 30.0},
        description='spectral conditioning of attention, lambda 30'),
    graying_e030=dict(
        config='configs/demo/mask-rcnn_swin-mini-graying_fpn_12e_shapes.py',
        lrs=dict(best_of='baseline'),
        cfg_options={'model.backbone.conditioning.epsilon': 0.3},
        description='Token Graying, epsilon 0.3'),
    graying_e060=dict(
        config='configs/demo/mask-rcnn_swin-mini-graying_fpn_12e_shapes.py',
        lrs=dict(best_of='baseline'),
        cfg_options={'model.backbone.conditioning.epsilon': 0.6},
        description='Token Graying, epsilon 0.6'),
    graying_e080=dict(
        config='configs/demo/mask-rcnn_swin-mini-graying_fpn_12e_shapes.py',
        lrs=dict(best_of='baseline'),
        cfg_options={'model.backbone.conditioning.epsilon': 0.8},
        description='Token Graying, epsilon 0.8'),
    graying_e095=dict(
        config='configs/demo/mask-rcnn_swin-mini-graying_fpn_12e_shapes.py',
        lrs=dict(best_of='baseline'),
        cfg_options={'model.backbone.conditioning.epsilon': 0.95},
        description='Token Graying, epsilon 0.95'),
)
