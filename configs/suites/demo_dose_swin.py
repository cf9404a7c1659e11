# Suite for tools/suites/run_suite.py: dose-response of each conditioning method's strength on the demo Swin
# (synthetic shapes, 2 CPU cores). It is demo_methods_swin.py (the baseline and the three methods at their published
# settings, every learning rate and seed) plus two more strengths of each method, one on each side of the published
# one where the knob allows, each at the learning rate where its method's published setting did best
# (best_of=METHOD), so that along one method's curve only the strength changes:
#   conditioned embedded tokens: target kappa 1.25, 2 (the paper), 8 (stronger as it falls)
#   spectral conditioning of attention: lambda 3, 10 (the paper), 30 (stronger as it grows)
#   Token Graying: epsilon 0.3, 0.6, 0.95 (the authors' default; stronger as it falls, kappa -> kappa^eps;
#   their sweep peaks at 0.6-0.7)
# Run after demo_methods_swin.py, its cells linked in, so that only the new strengths train:
#   mkdir -p work_dirs/suites/demo_dose_swin && for v in baseline condtok spectral graying; do
#     ln -s ../demo_methods_swin/$v work_dirs/suites/demo_dose_swin/$v; done
#   python tools/suites/run_suite.py configs/suites/demo_dose_swin.py --jobs 2 --resume
_base_ = ['./demo_methods_swin.py']
description = ('Demo Swin Mask R-CNN (configs/demo/, data/shapes): dose-response of conditioned tokens '
               '(target kappa), spectral conditioning (lambda) and Token Graying (epsilon), each strength at '
               "the best learning rate of its method's published setting.")
# each dose uses its method's config, taken from the methods suite
_condtok = {{_base_.variants.condtok.config}}
_spectral = {{_base_.variants.spectral.config}}
_graying = {{_base_.variants.graying.config}}
variants = dict(
    condtok_k1_25=dict(config=_condtok, lrs=dict(best_of='condtok'),
                       cfg_options={'model.backbone.conditioning.target_kappa': 1.25},
                       description='conditioned embedded tokens, target kappa 1.25'),
    condtok_k8=dict(config=_condtok, lrs=dict(best_of='condtok'),
                    cfg_options={'model.backbone.conditioning.target_kappa': 8.0},
                    description='conditioned embedded tokens, target kappa 8'),
    spectral_l3=dict(config=_spectral, lrs=dict(best_of='spectral'), cfg_options={'model.backbone.lam': 3.0},
                     description='spectral conditioning of attention, lambda 3'),
    spectral_l30=dict(config=_spectral, lrs=dict(best_of='spectral'), cfg_options={'model.backbone.lam': 30.0},
                      description='spectral conditioning of attention, lambda 30'),
    graying_e0_3=dict(config=_graying, lrs=dict(best_of='graying'),
                      cfg_options={'model.backbone.conditioning.epsilon': 0.3},
                      description='Token Graying, epsilon 0.3'),
    graying_e0_6=dict(config=_graying, lrs=dict(best_of='graying'),
                      cfg_options={'model.backbone.conditioning.epsilon': 0.6},
                      description='Token Graying, epsilon 0.6'),
)
