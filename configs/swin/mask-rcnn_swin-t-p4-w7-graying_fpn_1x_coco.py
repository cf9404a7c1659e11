# Swin-T Mask R-CNN 1x on COCO with Token Graying (arXiv 2505.01996) of the embedded tokens, in its SVD form: the
# baseline twin plus the conditioner in mode 'graying' on the patch-embedding output, one token matrix per image,
# X = U S V^T -> U (S / s_1)^eps V^T with eps = 0.95, the authors' default; C treated as a constant.
_base_ = './mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py'

model = dict(
    # mmdet's DetDataPreprocessor that also records each image's unpadded size, so that every image is
    # grayed on its own tokens and not on the padding its batch-mates force.
    data_preprocessor=dict(type='ValidRegionDetDataPreprocessor'),
    backbone=dict(
        type='CondSwinTransformer',
        conditioning=dict(type='TokenConditioner', mode='graying', epsilon=0.95, detach=True),
        condition_stages=(0, )))
