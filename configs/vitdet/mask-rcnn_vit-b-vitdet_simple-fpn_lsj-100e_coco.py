# Baseline twin of mask-rcnn_vit-b-vitdet-condtok_simple-fpn_lsj-100e_coco.py: ViTDet's Mask R-CNN with a
# MAE-pretrained ViT-B, simple feature pyramid, large-scale jitter at 1024 x 1024, 100 epochs on COCO, as in
# mmdet 3.3.0's projects/ViTDet (vitdet_mask-rcnn_vit-b-mae_lsj-100e.py + lsj-100e_coco-instance.py), with
# condtok_mm's ViTDetViT / ViTDetFPN / ViTDetLN2d / ViTDetLayerDecayOptimizerConstructor in place of the
# project's ViT / SimpleFPN / LN2d / LayerDecayOptimizerConstructor, which mmdet's pip wheel does not ship.
# Reference (mmdet 3.3.0 projects/ViTDet README, COCO val2017): box AP 51.6, mask AP 45.7, trained on
# 64 GPUs x 1 image (batch 64) with the project's Fp16CompresssionHook (fp16 gradient all-reduce, box AP
# 51.4 -> 51.6 by its docstring), which condtok_mm does not carry.
# On a machine without a GPU, tools/train.py trains in float32 instead of AMP (with a warning). The COCO metrics
# are computed by FastCocoMetric, as in the other COCO configs here.
_base_ = [
    'mmdet::_base_/models/mask-rcnn_r50_fpn.py',
    'mmdet::_base_/default_runtime.py',
]

# condtok_mm registers our modules; condtok_mm.compat.enable opts in to its run-time fixes for the installed
# stack (checkpoint loading on torch >= 2.6, CPU launchers, atomic checkpoints, exact --resume).
custom_imports = dict(imports=['condtok_mm', 'condtok_mm.compat.enable'], allow_failed_imports=False)
# Record kappa of the embedded tokens and of every attention layer (text log, scalars.json, TensorBoard); the
# 64 x 64 global attention at 1024 is above the hook's max_attention_tokens and only its output is recorded.
custom_hooks = [dict(type='AttentionKappaHook', interval=50)]

# ---- model (projects/ViTDet/configs/vitdet_mask-rcnn_vit-b-mae_lsj-100e.py)
backbone_norm_cfg = dict(type='LN', requires_grad=True)
norm_cfg = dict(type='ViTDetLN2d', requires_grad=True)
image_size = (1024, 1024)
batch_augments = [dict(type='BatchFixedSizePad', size=image_size, pad_mask=True)]
model = dict(
    data_preprocessor=dict(pad_size_divisor=32, batch_augments=batch_augments),
    backbone=dict(
        _delete_=True,
        type='ViTDetViT',
        img_size=1024,
        patch_size=16,
        embed_dim=768,
        depth=12,
        num_heads=12,
        drop_path_rate=0.1,
        window_size=14,
        mlp_ratio=4,
        qkv_bias=True,
        norm_cfg=backbone_norm_cfg,
        window_block_indexes=[0, 1, 3, 4, 6, 7, 9, 10],
        use_rel_pos=True,
        # MAE ViT-B (facebookresearch/mae), the weights mmdet's config names 'mae_pretrain_vit_base.pth'
        init_cfg=dict(
            type='Pretrained',
            checkpoint='https://dl.fbaipublicfiles.com/mae/pretrain/mae_pretrain_vit_base.pth')),
    neck=dict(
        _delete_=True,
        type='ViTDetFPN',
        backbone_channel=768,
        in_channels=[192, 384, 768, 768],
        out_channels=256,
        num_outs=5,
        norm_cfg=norm_cfg),
    rpn_head=dict(num_convs=2),
    roi_head=dict(
        bbox_head=dict(type='Shared4Conv1FCBBoxHead', conv_out_channels=256, norm_cfg=norm_cfg),
        mask_head=dict(norm_cfg=norm_cfg)))

# ---- data: large-scale jitter (projects/ViTDet/configs/lsj-100e_coco-instance.py)
dataset_type = 'CocoDataset'
data_root = 'data/coco/'
backend_args = None
train_pipeline = [
    dict(type='LoadImageFromFile', backend_args=backend_args),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='RandomResize', scale=image_size, ratio_range=(0.1, 2.0), keep_ratio=True),
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
    dict(type='LoadImageFromFile', backend_args=backend_args),
    dict(type='Resize', scale=image_size, keep_ratio=True),
    dict(type='Pad', size=image_size, pad_val=dict(img=(114, 114, 114))),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(
        type='PackDetInputs',
        meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor'))
]
train_dataloader = dict(
    batch_size=4,
    num_workers=8,
    persistent_workers=True,
    sampler=dict(type='DefaultSampler', shuffle=True),
    dataset=dict(
        type=dataset_type,
        data_root=data_root,
        ann_file='annotations/instances_train2017.json',
        data_prefix=dict(img='train2017/'),
        filter_cfg=dict(filter_empty_gt=True, min_size=32),
        pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=1,
    num_workers=2,
    persistent_workers=True,
    drop_last=False,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(
        type=dataset_type,
        data_root=data_root,
        ann_file='annotations/instances_val2017.json',
        data_prefix=dict(img='val2017/'),
        test_mode=True,
        pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(
    type='FastCocoMetric',  # the same numbers as mmdet's CocoMetric, computed faster
    ann_file=data_root + 'annotations/instances_val2017.json',
    metric=['bbox', 'segm'],
    format_only=False)
test_evaluator = val_evaluator

# ---- schedule: AdamW with layer-wise LR decay 0.7 over the 12 blocks, 100 epochs at batch 64
optim_wrapper = dict(
    type='AmpOptimWrapper',
    constructor='ViTDetLayerDecayOptimizerConstructor',
    paramwise_cfg=dict(decay_rate=0.7, decay_type='layer_wise', num_layers=12),
    optimizer=dict(type='AdamW', lr=0.0001, betas=(0.9, 0.999), weight_decay=0.1))

# 100 ep = 184375 iters * 64 images/iter / 118000 images/ep
max_iters = 184375
interval = 5000
dynamic_intervals = [(max_iters // interval * interval + 1, max_iters)]
param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=250),
    dict(
        type='MultiStepLR',
        begin=0,
        end=max_iters,
        by_epoch=False,
        # 88 and 96 epochs
        milestones=[163889, 177546],
        gamma=0.1)
]
train_cfg = dict(
    type='IterBasedTrainLoop', max_iters=max_iters, val_interval=interval,
    dynamic_intervals=dynamic_intervals)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')

default_hooks = dict(
    logger=dict(type='LoggerHook', interval=50),
    checkpoint=dict(
        type='CheckpointHook', by_epoch=False, save_last=True, interval=interval, max_keep_ckpts=5))
vis_backends = [dict(type='LocalVisBackend'), dict(type='TensorboardVisBackend')]
visualizer = dict(type='DetLocalVisualizer', vis_backends=vis_backends, name='visualizer')
log_processor = dict(type='LogProcessor', window_size=50, by_epoch=False)

# mmdet's ViTDet config has no `enable` here, so `tools/train.py --auto-scale-lr` refused it
auto_scale_lr = dict(enable=False, base_batch_size=64)
