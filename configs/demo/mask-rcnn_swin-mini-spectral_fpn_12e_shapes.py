# CPU-sized demo with the spectral shift of attention: the baseline demo plus the lines that
# configs/swin/mask-rcnn_swin-t-p4-w7-spectral_fpn_1x_coco.py adds to its twin (W_Q, W_K, W_V + lambda I).
_base_ = './mask-rcnn_swin-mini_fpn_12e_shapes.py'

model = dict(
    backbone=dict(
        _delete_=True,
        type='SpectralAttentionBackbone',
        backbone={{_base_.model.backbone}},
        lam=10.0))
