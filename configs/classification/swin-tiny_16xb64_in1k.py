# Baseline twin of swin-tiny-condtok_16xb64_in1k: mmpretrain's Swin-T recipe with condtok_mm imported and the
# kappa hook on. Protocol P0/P1's backbone is mmdet's public ImageNet Swin-T; this pair pretrains the Swin-T of
# protocol P2 (configs/suites/coco_protocols_swin-t_1x.py), whose mmpretrain checkpoint has mmdet's Swin keys.
_base_ = 'mmpretrain::swin_transformer/swin-tiny_16xb64_in1k.py'

# condtok_mm registers our modules; condtok_mm.compat.enable opts in to its run-time fixes for the installed
# stack (checkpoint loading on torch >= 2.6, CPU launchers, atomic checkpoints, exact --resume).
custom_imports = dict(imports=['condtok_mm', 'condtok_mm.compat.enable'], allow_failed_imports=False)

custom_hooks = [dict(type='AttentionKappaHook', interval=50)]
vis_backends = [dict(type='LocalVisBackend'), dict(type='TensorboardVisBackend')]
visualizer = dict(vis_backends=vis_backends)

# mmpretrain's base batch size, with the switch mmdet-style --auto-scale-lr expects
auto_scale_lr = dict(enable=False, base_batch_size=1024)
