# Swin-T on ImageNet-1k (mmpretrain's recipe) with conditioned embedded tokens: the baseline twin's backbone
# wrapped so that its patch-embedding output is conditioned (kappa <= 2) before the first transformer block.
# Protocol P2's pretraining for configs/swin/mask-rcnn_swin-t-p4-w7-condtok_fpn_1x_coco.py (the keys match mmdet's
# Swin: see configs/suites/coco_protocols_swin-t_1x.py).
_base_ = './swin-tiny_16xb64_in1k.py'

model = dict(
    backbone=dict(
        _delete_=True,
        type='CondTokBackbone',
        backbone={{_base_.model.backbone}},
        conditioning=dict(type='TokenConditioner', mode='sigma_max', alpha=1.0, target_kappa=2.0,
                          detach=True),
        targets=('patch_embed', )))
