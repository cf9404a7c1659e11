# ViTDet Mask R-CNN, ViT-B (MAE), LSJ 100 epochs on COCO, with the spectral shift of attention (arXiv
# 2603.07162): the baseline twin's backbone wrapped so that W_Q, W_K and W_V of every attention (window and
# global blocks) are used as W + lambda I (lambda = 10), added in the forward; the MAE weights load unchanged.
_base_ = './mask-rcnn_vit-b-vitdet_simple-fpn_lsj-100e_coco.py'

model = dict(
    backbone=dict(
        _delete_=True,
        type='SpectralAttentionBackbone',
        backbone={{_base_.model.backbone}},
        lam=10.0))
