# Baseline twin of davit-base-condtok_4xb256_in1k:
# mmpretrain's config with condtok_mm imported and the kappa hook on.
# Paper reference (ImageNet-1k top-1): DaViT-B 83.6 -> 84.6 conditioned.
_base_ = 'mmpretrain::davit/davit-base_4xb256_in1k.py'

# condtok_mm registers our modules; condtok_mm.compat.enable opts in to its run-time fixes for the installed
# stack (checkpoint loading on torch >= 2.6, CPU launchers, atomic checkpoints, exact --resume).
custom_imports = dict(imports=['condtok_mm', 'condtok_mm.compat.enable'], allow_failed_imports=False)

custom_hooks = [dict(type='AttentionKappaHook', interval=50)]
vis_backends = [dict(type='LocalVisBackend'), dict(type='TensorboardVisBackend')]
visualizer = dict(vis_backends=vis_backends)

# mmpretrain's base batch size, with the switch mmdet-style --auto-scale-lr expects
auto_scale_lr = dict(enable=False, base_batch_size=1024)
