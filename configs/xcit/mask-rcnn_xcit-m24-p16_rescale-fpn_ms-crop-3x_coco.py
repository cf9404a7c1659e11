# Baseline twin of mask-rcnn_xcit-m24-p16-condtok_rescale-fpn_ms-crop-3x_coco.py: XCiT-M24/16 in the XCiT-S12
# setting (features of XCA layers 7, 11, 15, 23).
# Paper reference (COCO val): box AP 45.7, mask AP 40.8 (baseline) -> 46.2 / 41.4 (conditioned).
_base_ = './mask-rcnn_xcit-s12-p16_rescale-fpn_ms-crop-3x_coco.py'

pretrained = 'https://download.openmmlab.com/mmclassification/v0/xcit/xcit-medium-24-p16_3rdparty_in1k_20230213-ad0aa92e.pth'  # noqa
embed_dims = 512
model = dict(
    backbone=dict(
        embed_dims=embed_dims,
        depth=24,
        num_heads=8,
        layer_scale_init_value=1e-5,
        drop_path_rate=0.1,
        out_indices=(7, 11, 15, 23),
        init_cfg=dict(type='Pretrained', checkpoint=pretrained, prefix='backbone.')),
    neck=dict(in_channels=embed_dims))
