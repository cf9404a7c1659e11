# Baseline twin of mask-rcnn_xcit-s12-p16-condtok_rescale-fpn_ms-crop-3x_coco.py: the paper's own COCO setting,
# Mask R-CNN with XCiT-S12/16 (mmpretrain's XCiT, ImageNet-1k weights) on mmdet's Swin 3x multi-scale-crop recipe
# (AdamW 1e-4, 36 epochs). Features of XCA layers 3, 5, 7, 11 are rescaled to strides 4-32 and fed to an FPN.
# Paper reference (COCO val): box AP 44.9, mask AP 40.1 (baseline) -> 45.7 / 40.4 (conditioned).
_base_ = 'mmdet::swin/mask-rcnn_swin-t-p4-w7_fpn_ms-crop-3x_coco.py'

# condtok_mm registers our modules; condtok_mm.compat.enable opts in to its run-time fixes for the installed
# stack (checkpoint loading on torch >= 2.6, CPU launchers, atomic checkpoints, exact --resume).
custom_imports = dict(imports=['condtok_mm', 'condtok_mm.compat.enable'], allow_failed_imports=False)
custom_hooks = [dict(type='AttentionKappaHook', interval=50)]
vis_backends = [dict(type='LocalVisBackend'), dict(type='TensorboardVisBackend')]
visualizer = dict(vis_backends=vis_backends)
val_evaluator = dict(type='FastCocoMetric')
test_evaluator = dict(type='FastCocoMetric')

pretrained = 'https://download.openmmlab.com/mmclassification/v0/xcit/xcit-small-12-p16_3rdparty_in1k_20230213-d36779d2.pth'  # noqa
embed_dims = 384
model = dict(
    backbone=dict(
        _delete_=True,
        type='mmpretrain.XCiT',
        patch_size=16,
        embed_dims=embed_dims,
        depth=12,
        num_heads=8,
        mlp_ratio=4,
        qkv_bias=True,
        layer_scale_init_value=1.0,
        tokens_norm=True,
        drop_path_rate=0.05,
        out_type='featmap',
        out_indices=(3, 5, 7, 11),
        init_cfg=dict(type='Pretrained', checkpoint=pretrained, prefix='backbone.')),
    neck=dict(
        _delete_=True,
        type='RescaleFPN',
        in_channels=embed_dims,
        fpn=dict(type='FPN', out_channels=256, num_outs=5)))
