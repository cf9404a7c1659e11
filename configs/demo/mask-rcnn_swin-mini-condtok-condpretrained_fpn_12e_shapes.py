# Protocol P2 (conditioned pretraining) at the demo scale: P1's detector
# (configs/demo/mask-rcnn_swin-mini-condtok-pretrained_fpn_12e_shapes.py) fine-tuned from the mini-Swin pretrained
# WITH conditioning (configs/demo/swin-mini-condtok_1xb32-20e_shapes-cls.py; CondTokBackbone has the wrapped
# Swin's keys, so its checkpoint loads as this backbone):
#   python tools/train.py configs/demo/swin-mini-condtok_1xb32-20e_shapes-cls.py
#   python tools/train.py configs/demo/mask-rcnn_swin-mini-condtok-condpretrained_fpn_12e_shapes.py
_base_ = './mask-rcnn_swin-mini-condtok-pretrained_fpn_12e_shapes.py'

model = dict(backbone=dict(init_cfg=dict(checkpoint='work_dirs/swin-mini-condtok_1xb32-20e_shapes-cls/epoch_20.pth')))
