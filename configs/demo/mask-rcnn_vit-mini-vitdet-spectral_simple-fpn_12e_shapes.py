# CPU-sized ViTDet demo with the spectral shift of attention: the baseline demo plus the lines that
# configs/vitdet/mask-rcnn_vit-b-vitdet-spectral_simple-fpn_lsj-100e_coco.py adds to its twin.
_base_ = './mask-rcnn_vit-mini-vitdet_simple-fpn_12e_shapes.py'

model = dict(
    backbone=dict(
        _delete_=True,
        type='SpectralAttentionBackbone',
        backbone={{_base_.model.backbone}},
        lam=10.0))
