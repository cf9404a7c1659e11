# UPerNet Swin-T on ADE20K (mmseg's recipe) with conditioned embedded tokens: the baseline twin plus the
# conditioning. CondSwinTransformer takes the arguments of mmseg's SwinTransformer.
_base_ = './upernet_swin-t-p4-w7_8xb2-160k_ade20k-512x512.py'

model = dict(
    backbone=dict(
        type='CondSwinTransformer',
        conditioning=dict(type='TokenConditioner', mode='sigma_max', alpha=1.0, target_kappa=2.0,
                          detach=True),
        condition_stages=(0, )))
