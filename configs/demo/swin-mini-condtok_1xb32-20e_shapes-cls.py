# The conditioned twin of swin-mini_1xb32-20e_shapes-cls.py (protocol P2's pretraining): its backbone wrapped so
# that the patch-embedding output is conditioned (kappa <= 2) before the first block, as
# configs/classification/swin-base-condtok_16xb64_in1k.py does on ImageNet.
#   python tools/train.py configs/demo/swin-mini-condtok_1xb32-20e_shapes-cls.py
_base_ = './swin-mini_1xb32-20e_shapes-cls.py'

model = dict(
    backbone=dict(
        _delete_=True,
        type='CondTokBackbone',
        backbone={{_base_.model.backbone}},
        conditioning=dict(type='TokenConditioner', mode='sigma_max', alpha=1.0, target_kappa=2.0,
                          detach=True),
        targets=('patch_embed', )))
