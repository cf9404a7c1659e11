# CPU-sized segmentation demo with conditioned embedded tokens: the baseline twin plus the conditioning.
_base_ = './upernet_swin-mini_1xb4-200it_shapes-128x128.py'

model = dict(
    backbone=dict(
        type='CondSwinTransformer',
        conditioning=dict(type='TokenConditioner', mode='sigma_max', alpha=1.0, target_kappa=2.0,
                          detach=True),
        condition_stages=(0, )))
