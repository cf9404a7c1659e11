# Mask R-CNN with XCiT-S12/16 and the spectral shift of attention (arXiv 2603.07162; the paper reports XCiT-S
# 44.9 -> 45.6 box AP, 40.1 -> 40.5 mask AP): the baseline twin's backbone wrapped so that the query, key and
# value projections of every XCA and class-attention layer are used as W + lambda I (lambda = 10).
_base_ = './mask-rcnn_xcit-s12-p16_rescale-fpn_ms-crop-3x_coco.py'

model = dict(
    backbone=dict(
        _delete_=True,
        type='SpectralAttentionBackbone',
        backbone={{_base_.model.backbone}},
        lam=10.0))
