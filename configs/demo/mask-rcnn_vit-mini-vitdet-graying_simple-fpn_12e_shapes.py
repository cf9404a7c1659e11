# CPU-sized ViTDet demo with Token Graying: the baseline demo plus the lines that
# configs/vitdet/mask-rcnn_vit-b-vitdet-graying_simple-fpn_lsj-100e_coco.py adds to its twin.
_base_ = './mask-rcnn_vit-mini-vitdet_simple-fpn_12e_shapes.py'

model = dict(
    # mmdet's DetDataPreprocessor that also records each image's unpadded size, so that every image is
    # grayed on its own tokens and not on the padding its batch-mates force.
    data_preprocessor=dict(type='ValidRegionDetDataPreprocessor'),
    backbone=dict(
        type='CondViT',
        conditioning=dict(type='TokenConditioner', mode='graying', epsilon=0.95, detach=True),
        condition_after_pos_embed=False))
