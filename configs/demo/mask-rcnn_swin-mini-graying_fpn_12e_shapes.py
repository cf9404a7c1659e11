# CPU-sized demo with Token Graying: the baseline demo plus the lines that
# configs/swin/mask-rcnn_swin-t-p4-w7-graying_fpn_1x_coco.py adds to its twin.
_base_ = './mask-rcnn_swin-mini_fpn_12e_shapes.py'

model = dict(
    # mmdet's DetDataPreprocessor that also records each image's unpadded size, so that every image is
    # grayed on its own tokens and not on the padding its batch-mates force.
    data_preprocessor=dict(type='ValidRegionDetDataPreprocessor'),
    backbone=dict(
        type='CondSwinTransformer',
        conditioning=dict(type='TokenConditioner', mode='graying', epsilon=0.95, detach=True),
        condition_stages=(0, )))
