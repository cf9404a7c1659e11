# CPU-sized baseline on real photographs: Faster R-CNN (boxes only) with the demo's mini-Swin (narrow, shallow,
# window 4, from scratch), trained on the NEON tree-crown tiles that `python tools/dataset/make_neon_trees.py`
# writes to data/neon_trees/ (one class, 400 px tiles of 10 cm aerial photographs; docs/en/user_guides/
# neon_trees.md). Training sees random 192 px crops in all eight flips and 90-degree rotations; validation is the
# bottom band of the training image, and the test split is the held-out second Yellowstone image.
_base_ = 'mmdet::faster_rcnn/faster-rcnn_r50_fpn_1x_coco.py'

custom_imports = dict(imports=['condtok_mm', 'condtok_mm.compat.enable'], allow_failed_imports=False)

data_root = 'data/neon_trees/'
metainfo = dict(classes=('tree', ), palette=[(0, 200, 0)])
crop_size = (192, 192)
embed_dims = 32
fpn_channels = 64

model = dict(
    backbone=dict(
        _delete_=True,
        type='SwinTransformer',  # the demo's mini-Swin (configs/demo/mask-rcnn_swin-mini_fpn_12e_shapes.py)
        embed_dims=embed_dims,
        depths=[1, 1, 2, 1],
        num_heads=[1, 2, 4, 8],
        window_size=4,
        mlp_ratio=4,
        qkv_bias=True,
        drop_path_rate=0.1,
        patch_norm=True,
        out_indices=(0, 1, 2, 3),
        convert_weights=False,
        init_cfg=None),  # trained from scratch: nothing is downloaded
    neck=dict(in_channels=[embed_dims * 2**i for i in range(4)], out_channels=fpn_channels),
    rpn_head=dict(
        in_channels=fpn_channels,
        feat_channels=fpn_channels,
        anchor_generator=dict(scales=[4])),  # anchors of 16-256 px; the crowns are 8-107 px
    roi_head=dict(
        # torchvision's RoIAlign: the same op as mmcv's (aligned=True) with a faster CPU backward
        bbox_roi_extractor=dict(
            roi_layer=dict(type='RoIAlign', output_size=7, sampling_ratio=0, use_torchvision=True),
            out_channels=fpn_channels),
        bbox_head=dict(in_channels=fpn_channels, fc_out_channels=256, num_classes=1)),
    train_cfg=dict(
        rpn_proposal=dict(nms_pre=500, max_per_img=300),
        rcnn=dict(sampler=dict(num=128))),
    test_cfg=dict(
        rpn=dict(nms_pre=500, max_per_img=300),
        rcnn=dict(max_per_img=100)))  # a 400 px tile holds at most ~70 crowns

train_pipeline = [
    dict(type='LoadImageFromFile', backend_args=None),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(type='RandomCrop', crop_size=crop_size),  # a crop without a crown is drawn again
    # the eight symmetries of the square: 3 flips or none, each then turned by 90 degrees or not (an aerial
    # photograph taken from straight above has no up)
    dict(type='RandomFlip', prob=[0.25, 0.25, 0.25], direction=['horizontal', 'vertical', 'diagonal']),
    dict(type='Rotate', prob=0.5, min_mag=90., max_mag=90.),
    # mmdet's Rotate turns boxes about the centre of the edge pixels, one pixel off the image's own rotation: a box
    # along an edge can come back zero wide, whose log-size regression target made loss_bbox NaN within 5 epochs
    dict(type='FilterAnnotations', min_gt_bbox_wh=(1, 1)),
    dict(type='PackDetInputs')
]
test_pipeline = [
    dict(type='LoadImageFromFile', backend_args=None),
    dict(type='Resize', scale=(400, 400), keep_ratio=True),  # the identity on the 400 px tiles; mmdet's heads
    # read the scale factor it records
    dict(type='LoadAnnotations', with_bbox=True),
    dict(type='PackDetInputs', meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor'))
]
train_dataloader = dict(
    batch_size=4,
    num_workers=1,
    dataset=dict(data_root=data_root, metainfo=metainfo, ann_file='annotations/instances_train.json',
                 data_prefix=dict(img='train/'), pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=2,
    num_workers=1,
    dataset=dict(data_root=data_root, metainfo=metainfo, ann_file='annotations/instances_val.json',
                 data_prefix=dict(img='val/'), pipeline=test_pipeline))
test_dataloader = dict(
    batch_size=2,
    num_workers=1,
    dataset=dict(data_root=data_root, metainfo=metainfo, ann_file='annotations/instances_test.json',
                 data_prefix=dict(img='test/'), pipeline=test_pipeline))
# mmdet's CocoMetric: AP, AP50, AP75 and AP by size (most crowns are COCO 'small' or 'medium': under 32^2 or 96^2 px)
val_evaluator = dict(type='CocoMetric', ann_file=data_root + 'annotations/instances_val.json', metric='bbox')
test_evaluator = dict(type='CocoMetric', ann_file=data_root + 'annotations/instances_test.json', metric='bbox')

# 28 tiles with crowns in batches of 4: 7 iterations an epoch, 2800 in all. From scratch on ~30 tiles the detector
# learns slowly: at a constant 1e-3 the validation AP climbs for ~200 epochs and then wanders; the two x0.1 steps
# settle it (docs/en/studies/records/neon_pilot/ has the curves that sized this schedule).
max_epochs = 400
train_cfg = dict(max_epochs=max_epochs, val_interval=20)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=50),
    dict(type='MultiStepLR', begin=0, end=max_epochs, by_epoch=True, milestones=[320, 380], gamma=0.1)
]
optim_wrapper = dict(
    optimizer=dict(_delete_=True, type='AdamW', lr=1e-3, betas=(0.9, 0.999), weight_decay=0.05),
    paramwise_cfg=dict(custom_keys=dict(
        absolute_pos_embed=dict(decay_mult=0.), relative_position_bias_table=dict(decay_mult=0.),
        norm=dict(decay_mult=0.))))
auto_scale_lr = dict(enable=False, base_batch_size=4)  # lr 1e-3 is for 1 process x 4 images

custom_hooks = [dict(type='AttentionKappaHook', interval=140)]  # kappa of the tokens, both twins, every 20 epochs
default_hooks = dict(
    logger=dict(interval=14),
    checkpoint=dict(interval=4, max_keep_ckpts=1))  # an interrupted run resumes from at most 4 epochs back
