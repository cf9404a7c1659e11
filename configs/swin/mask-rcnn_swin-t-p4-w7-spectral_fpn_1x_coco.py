# Swin-T Mask R-CNN 1x on COCO with the spectral shift of attention (arXiv 2603.07162): the baseline twin's
# backbone wrapped so that W_Q, W_K and W_V of every window attention are used as W + lambda I (lambda = 10, the
# paper's value), added in the forward and never saved into the weights.
_base_ = './mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py'

model = dict(
    backbone=dict(
        _delete_=True,
        type='SpectralAttentionBackbone',
        backbone={{_base_.model.backbone}},
        lam=10.0))
