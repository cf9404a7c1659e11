# ViTDet Mask R-CNN, ViT-B (MAE), LSJ 100 epochs on COCO, with Token Graying (arXiv 2505.01996) of the embedded
# tokens in its SVD form: the baseline twin plus the conditioner in mode 'graying' on the patch-embedding output
# (before the position embedding), one token matrix per image, X = U S V^T -> U (S / s_1)^eps V^T with eps = 0.95, the authors' default; C treated as a constant.
_base_ = './mask-rcnn_vit-b-vitdet_simple-fpn_lsj-100e_coco.py'

model = dict(
    # mmdet's DetDataPreprocessor that also records each image's unpadded size, so that every image is
    # grayed on its own tokens and not on the padding its batch-mates force.
    data_preprocessor=dict(type='ValidRegionDetDataPreprocessor'),
    backbone=dict(
        type='CondViT',
        conditioning=dict(type='TokenConditioner', mode='graying', epsilon=0.95, detach=True),
        condition_after_pos_embed=False))
