# Swin-B on ImageNet-1k (mmpretrain's recipe) with conditioned embedded tokens: the baseline
# twin's backbone wrapped so that its patch-embedding output is conditioned (kappa <= 2) before the
# first transformer block.
_base_ = './swin-base_16xb64_in1k.py'

model = dict(
    backbone=dict(
        _delete_=True,
        type='CondTokBackbone',
        backbone={{_base_.model.backbone}},
        conditioning=dict(type='TokenConditioner', mode='sigma_max', alpha=1.0, target_kappa=2.0,
                          detach=True),
        targets=('patch_embed', )))
