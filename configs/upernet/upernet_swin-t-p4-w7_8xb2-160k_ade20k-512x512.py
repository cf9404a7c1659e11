# Baseline twin of upernet_swin-t-p4-w7-condtok_8xb2-160k_ade20k-512x512.py: mmseg's own UPerNet Swin-T ADE20K
# config with condtok_mm imported and the same instrumentation as the conditioned run (kappa hook, TensorBoard);
# the model is unchanged. Train with mmseg's tools/train.py or `mim train mmseg CONFIG` (ADE20K at data/ade/).
_base_ = 'mmseg::swin/swin-tiny-patch4-window7-in1k-pre_upernet_8xb2-160k_ade20k-512x512.py'

# condtok_mm registers our modules; condtok_mm.compat.enable opts in to its run-time fixes for the installed
# stack (checkpoint loading on torch >= 2.6, CPU launchers, atomic checkpoints, exact --resume).
custom_imports = dict(imports=['condtok_mm', 'condtok_mm.compat.enable'], allow_failed_imports=False)

# Record kappa of the embedded tokens and of every attention layer (text log, scalars.json, TensorBoard).
custom_hooks = [dict(type='AttentionKappaHook', interval=50)]
vis_backends = [dict(type='LocalVisBackend'), dict(type='TensorboardVisBackend')]
visualizer = dict(vis_backends=vis_backends)

auto_scale_lr = dict(enable=False, base_batch_size=16)  # mmseg's recipe: 8 GPUs x 2 images
