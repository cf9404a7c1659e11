# Baseline twin of mask-rcnn_swin-t-p4-w7-condtok_fpn_1x_coco.py: mmdet's own config with condtok_mm imported
# and the same instrumentation as the conditioned run (kappa hook, TensorBoard); the model is unchanged. Its COCO
# metrics are computed by FastCocoMetric (the same numbers as mmdet's CocoMetric, computed faster).
# Reference (mmdet 3.3.0 model zoo, COCO val2017): box AP 42.7, mask AP 39.3.
_base_ = 'mmdet::swin/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py'

# condtok_mm registers our modules; condtok_mm.compat.enable opts in to its run-time fixes for the installed
# stack (checkpoint loading on torch >= 2.6, CPU launchers, atomic checkpoints, exact --resume).
custom_imports = dict(imports=['condtok_mm', 'condtok_mm.compat.enable'], allow_failed_imports=False)

# Record kappa of the embedded tokens and of every attention layer (text log, scalars.json, TensorBoard).
custom_hooks = [dict(type='AttentionKappaHook', interval=50)]
vis_backends = [dict(type='LocalVisBackend'), dict(type='TensorboardVisBackend')]
visualizer = dict(vis_backends=vis_backends)

val_evaluator = dict(type='FastCocoMetric')
test_evaluator = dict(type='FastCocoMetric')
