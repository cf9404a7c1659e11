# CPU-sized baseline demo of ViTDet: the ViT-B Mask R-CNN baseline twin shrunk (a 4-block ViT of width 96 with
# 4 x 4 windows in blocks 0 and 2, small heads, 128 x 128 images, 12 epochs) and trained from scratch on the
# embedded synthetic shapes dataset, so that it trains and evaluates on 2 CPU cores in minutes. Everything
# else is the recipe: ViTDetFPN, layer-wise LR decay, LSJ, AMP (float32 on a CPU). Create the data with
# `python tools/dataset/make_shapes.py --out-dir data/shapes/`.
_base_ = ['../vitdet/mask-rcnn_vit-b-vitdet_simple-fpn_lsj-100e_coco.py', './_base_/shapes.py']

data_root = _base_.shapes.data_root
metainfo = _base_.shapes.metainfo
image_size = (128, 128)
num_classes = len(metainfo['classes'])
embed_dim = 96
depth = 4
fpn_channels = 64

model = dict(
    data_preprocessor=dict(
        batch_augments=[dict(type='BatchFixedSizePad', size=image_size, pad_mask=True)]),
    backbone=dict(
        img_size=image_size[0],
        embed_dim=embed_dim,
        depth=depth,
        num_heads=3,
        window_size=4,
        window_block_indexes=[0, 2],
        pretrain_img_size=image_size[0],
        init_cfg=None),  # trained from scratch: nothing is downloaded
    neck=dict(
        backbone_channel=embed_dim,
        in_channels=[embed_dim // 4, embed_dim // 2, embed_dim, embed_dim],
        out_channels=fpn_channels),
    rpn_head=dict(
        in_channels=fpn_channels,
        feat_channels=fpn_channels,
        anchor_generator=dict(scales=[4])),  # objects are 20-60 px
    roi_head=dict(
        # torchvision's RoIAlign computes the same op as mmcv's (aligned=True) with a faster CPU backward
        bbox_roi_extractor=dict(
            roi_layer=dict(type='RoIAlign', output_size=7, sampling_ratio=0, use_torchvision=True),
            out_channels=fpn_channels),
        bbox_head=dict(
            in_channels=fpn_channels,
            conv_out_channels=fpn_channels,
            fc_out_channels=256,
            num_classes=num_classes),
        mask_roi_extractor=dict(
            roi_layer=dict(type='RoIAlign', output_size=14, sampling_ratio=0, use_torchvision=True),
            out_channels=fpn_channels),
        mask_head=dict(in_channels=fpn_channels, conv_out_channels=fpn_channels,
                       num_classes=num_classes)),
    train_cfg=dict(
        rpn_proposal=dict(nms_pre=500, max_per_img=300),
        rcnn=dict(sampler=dict(num=64))),
    test_cfg=dict(
        rpn=dict(nms_pre=300, max_per_img=100),
        rcnn=dict(max_per_img=30)))

# Large-scale jitter at 128 px with the scale range cut to 0.5-2.0: at ViTDet's 0.1 the 20-60 px shapes
# would shrink to 2-6 px, below the smallest anchor (16 px).
train_pipeline = [
    dict(type='LoadImageFromFile', backend_args=None),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='RandomResize', scale=image_size, ratio_range=(0.5, 2.0), keep_ratio=True),
    dict(
        type='RandomCrop',
        crop_type='absolute_range',
        crop_size=image_size,
        recompute_bbox=True,
        allow_negative_crop=True),
    dict(type='FilterAnnotations', min_gt_bbox_wh=(1e-2, 1e-2)),
    dict(type='Pad', size=image_size, pad_val=dict(img=(114, 114, 114))),
    dict(type='PackDetInputs')
]
test_pipeline = [
    dict(type='LoadImageFromFile', backend_args=None),
    dict(type='Resize', scale=image_size, keep_ratio=True),
    dict(type='Pad', size=image_size, pad_val=dict(img=(114, 114, 114))),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(
        type='PackDetInputs',
        meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor'))
]
train_dataloader = _base_.shapes.train_dataloader
train_dataloader.dataset.pipeline = train_pipeline
val_dataloader = _base_.shapes.val_dataloader
val_dataloader.dataset.pipeline = test_pipeline
test_dataloader = val_dataloader
val_evaluator = _base_.shapes.val_evaluator
test_evaluator = val_evaluator

# Epochs instead of ViTDet's iterations: 50 iterations per epoch here.
# from scratch with a small batch: the Swin demo's learning rate (1e-3 beat 4e-4 there)
optim_wrapper = dict(paramwise_cfg=dict(num_layers=depth), optimizer=dict(lr=1e-3))
max_epochs = 12
train_cfg = dict(_delete_=True, type='EpochBasedTrainLoop', max_epochs=max_epochs, val_interval=max_epochs)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=100),
    dict(type='MultiStepLR', begin=0, end=max_epochs, by_epoch=True, milestones=[9, 11], gamma=0.1)
]
default_hooks = dict(
    logger=dict(interval=10),
    checkpoint=dict(by_epoch=True, interval=4, max_keep_ckpts=2))
log_processor = dict(by_epoch=True)
auto_scale_lr = dict(base_batch_size=4)

del _base_.shapes  # taken apart above; see configs/demo/_base_/shapes.py
