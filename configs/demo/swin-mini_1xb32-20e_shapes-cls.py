# CPU-sized pretraining for the protocol study: the demo detector's mini-Swin (the backbone of
# configs/demo/mask-rcnn_swin-mini_fpn_12e_shapes.py, built as mmpretrain's SwinTransformer, which has mmdet's
# state-dict keys) trained by mmpretrain to classify the shapes images by the class of their largest instance
# (ShapesClassificationDataset). Its own images, not the detection data's (seed 1; the detection data is seed 0):
#   python tools/dataset/make_shapes.py --out-dir data/shapes_cls/ --seed 1 --num-train 10000 --num-val 500
#   python tools/train.py configs/demo/swin-mini_1xb32-20e_shapes-cls.py
# The checkpoint loads as the detector's backbone (configs/demo/mask-rcnn_swin-mini-pretrained_fpn_12e_shapes.py).
_base_ = 'mmpretrain::_base_/default_runtime.py'

# condtok_mm registers our modules; condtok_mm.compat.enable opts in to its run-time fixes for the installed
# stack (checkpoint loading on torch >= 2.6, CPU launchers, atomic checkpoints, exact --resume).
custom_imports = dict(imports=['condtok_mm', 'condtok_mm.compat.enable'], allow_failed_imports=False)

data_root = 'data/shapes_cls/'
image_size = 128
embed_dims = 32
num_classes = 4

model = dict(
    type='ImageClassifier',
    backbone=dict(
        type='SwinTransformer',
        arch=dict(embed_dims=embed_dims, depths=[1, 1, 2, 1], num_heads=[1, 2, 4, 8]),
        img_size=image_size,
        window_size=4,
        drop_path_rate=0.1,
        # every stage's output norm, as the detector has them (norm0-norm3), so that every weight of the
        # detection backbone comes from this checkpoint; the head reads the last stage only
        out_indices=(0, 1, 2, 3)),
    neck=dict(type='GlobalAveragePooling'),
    head=dict(
        type='LinearClsHead',
        num_classes=num_classes,
        in_channels=embed_dims * 8,
        loss=dict(type='CrossEntropyLoss', loss_weight=1.0),
        topk=(1, )))

data_preprocessor = dict(
    num_classes=num_classes,
    # the detector's normalisation (mmdet's DetDataPreprocessor in the demo configs)
    mean=[123.675, 116.28, 103.53],
    std=[58.395, 57.12, 57.375],
    to_rgb=True)

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='RandomFlip', prob=0.5, direction='horizontal'),
    dict(type='PackInputs'),
]
test_pipeline = [dict(type='LoadImageFromFile'), dict(type='PackInputs')]
train_dataloader = dict(
    batch_size=32,
    num_workers=1,
    dataset=dict(type='ShapesClassificationDataset', data_root=data_root,
                 ann_file='annotations/instances_train.json', data_prefix=dict(img_path='train/'),
                 pipeline=train_pipeline),
    sampler=dict(type='DefaultSampler', shuffle=True))
val_dataloader = dict(
    batch_size=32,
    num_workers=1,
    dataset=dict(type='ShapesClassificationDataset', data_root=data_root,
                 ann_file='annotations/instances_val.json', data_prefix=dict(img_path='val/'),
                 pipeline=test_pipeline),
    sampler=dict(type='DefaultSampler', shuffle=False))
val_evaluator = dict(type='Accuracy', topk=(1, ))
test_dataloader = val_dataloader
test_evaluator = val_evaluator

# At lr 1e-3 for 20 epochs on 2000 images both backbones, with and without conditioning, ended at the majority
# class's share of the val images (the loss at the label prior's entropy): they learned the prior and nothing else.
# On 128 training images (150 steps of 32, no weight decay) the unconditioned one does not even fit them at 1e-3 or
# 3e-3 (train accuracy 0.45, the prior) and starts to at 1e-4 and 2.5e-4 (0.61, 0.73; conditioned at 2.5e-4: 1.0).
# At 2.5e-4 for 50 epochs on 2000 images both memorised them (val below the majority class); so 10000 images, 20
# epochs (6260 iterations), validated every 2 (docs/en/user_guides/protocols.md has every recipe's numbers).
max_epochs = 20
optim_wrapper = dict(
    optimizer=dict(type='AdamW', lr=2.5e-4, weight_decay=0.05),
    paramwise_cfg=dict(norm_decay_mult=0.0, bias_decay_mult=0.0,
                       custom_keys={'.relative_position_bias_table': dict(decay_mult=0.0)}))
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=True, begin=0, end=1, convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', eta_min=1e-5, by_epoch=True, begin=1, end=max_epochs)
]
train_cfg = dict(by_epoch=True, max_epochs=max_epochs, val_interval=2)
val_cfg = dict()
test_cfg = dict()
auto_scale_lr = dict(enable=False, base_batch_size=32)  # lr 2.5e-4 is for 1 process x 32 images

default_hooks = dict(
    logger=dict(interval=10),
    checkpoint=dict(interval=2, max_keep_ckpts=1))
randomness = dict(seed=0)
