# Baseline twin of mask-rcnn_swin-t-p4-w7-condtok_fpn_1x_coco.py: mmdet's own config with condtok_mm imported
# (the same tools, hooks and run-time fixes as the conditioned run) and its COCO metrics computed by
# FastCocoMetric (the same numbers as mmdet's CocoMetric, computed faster).
# Reference (mmdet 3.3.0 model zoo, COCO val2017): box AP 42.7, mask AP 39.3.
_base_ = 'mmdet::swin/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py'

custom_imports = dict(imports=['condtok_mm'], allow_failed_imports=False)

val_evaluator = dict(type='FastCocoMetric')
test_evaluator = dict(type='FastCocoMetric')
