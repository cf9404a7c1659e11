# Mask R-CNN with XCiT-S12/16 and Token Graying (arXiv 2505.01996) of the embedded tokens in its SVD form: the
# baseline twin's backbone wrapped so that its patch-embedding output is grayed before the first XCA block,
# X = U S V^T -> U (S / s_1)^eps V^T with eps = 0.95, the authors' default; C treated as a constant.
_base_ = './mask-rcnn_xcit-s12-p16_rescale-fpn_ms-crop-3x_coco.py'

model = dict(
    # mmdet's DetDataPreprocessor that also records each image's unpadded size, so that every image is
    # grayed on its own tokens and not on the padding its batch-mates force.
    data_preprocessor=dict(type='ValidRegionDetDataPreprocessor'),
    backbone=dict(
        _delete_=True,
        type='CondTokBackbone',
        backbone={{_base_.model.backbone}},
        conditioning=dict(type='TokenConditioner', mode='graying', epsilon=0.95, detach=True),
        targets=('patch_embed', )))
