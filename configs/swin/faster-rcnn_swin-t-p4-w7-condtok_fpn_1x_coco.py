# Swin-T Faster R-CNN 1x on COCO with conditioned embedded tokens: the baseline twin plus the conditioning.
_base_ = './faster-rcnn_swin-t-p4-w7_fpn_1x_coco.py'

model = dict(
    # mmdet's DetDataPreprocessor that also records each image's unpadded size, so that every image is
    # conditioned on its own tokens and not on the padding its batch-mates force.
    data_preprocessor=dict(type='ValidRegionDetDataPreprocessor'),
    backbone=dict(
        type='CondSwinTransformer',
        conditioning=dict(type='TokenConditioner', mode='sigma_max', alpha=1.0, target_kappa=2.0,
                          detach=True),
        condition_stages=(0, )))
