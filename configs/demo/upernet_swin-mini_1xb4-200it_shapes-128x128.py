# CPU-sized baseline segmentation demo: the UPerNet Swin-T ADE20K baseline twin shrunk (narrower and shallower
# Swin, small heads, 128x128 images) and trained from scratch on the semantic label maps of the embedded
# synthetic shapes dataset (`python tools/dataset/make_shapes.py` writes data/shapes/semantic/). Train with
# mmseg's own tools/train.py (or `mim train mmseg`): the config's custom_imports load condtok_mm.
_base_ = ['../upernet/upernet_swin-t-p4-w7_8xb2-160k_ade20k-512x512.py', './_base_/shapes.py']

data_root = _base_.shapes.data_root
metainfo = _base_.shapes.semantic_metainfo
image_size = (128, 128)
num_classes = len(metainfo['classes'])
embed_dims = 32

model = dict(
    data_preprocessor=dict(size=image_size),
    backbone=dict(
        embed_dims=embed_dims,
        depths=[1, 1, 2, 1],
        num_heads=[1, 2, 4, 8],
        window_size=4,
        drop_path_rate=0.1,
        init_cfg=None),  # trained from scratch: nothing is downloaded
    decode_head=dict(in_channels=[embed_dims * 2**i for i in range(4)], channels=64, num_classes=num_classes),
    auxiliary_head=dict(in_channels=embed_dims * 4, channels=32, num_classes=num_classes))

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', reduce_zero_label=False),  # 0 is the background class, not "ignore"
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackSegInputs')
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', reduce_zero_label=False),
    dict(type='PackSegInputs')
]
dataset = _base_.shapes.semantic_dataset
train_dataloader = dict(
    batch_size=4,
    num_workers=1,
    dataset=dict(_delete_=True, **dataset, data_prefix=_base_.shapes.semantic_train_prefix, pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=4,
    num_workers=1,
    dataset=dict(_delete_=True, **dataset, data_prefix=_base_.shapes.semantic_val_prefix, pipeline=test_pipeline))
test_dataloader = val_dataloader

max_iters = 200
train_cfg = dict(max_iters=max_iters, val_interval=max_iters)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=20),
    dict(type='PolyLR', eta_min=0.0, power=1.0, begin=20, end=max_iters, by_epoch=False)
]
# from scratch, small batch (mmseg's 6e-5 is for an ImageNet-pretrained Swin); not tuned
optim_wrapper = dict(optimizer=dict(lr=1e-3))
auto_scale_lr = dict(enable=False, base_batch_size=4)  # lr 1e-3 is for 1 process x 4 images

default_hooks = dict(logger=dict(interval=10), checkpoint=dict(interval=max_iters))

del _base_.shapes  # taken apart above; see configs/demo/_base_/shapes.py
