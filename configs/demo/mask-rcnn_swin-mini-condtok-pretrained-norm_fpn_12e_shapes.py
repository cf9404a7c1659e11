# Protocol P1-norm at the demo scale: P1 (configs/demo/mask-rcnn_swin-mini-condtok-pretrained_fpn_12e_shapes.py)
# with control='norm_matched': the tokens (X + C) / r, r = ||X + C||_F / ||X||_F, so kappa <= 2 at the token
# scale the pretrained weights know.
_base_ = './mask-rcnn_swin-mini-condtok-pretrained_fpn_12e_shapes.py'

model = dict(backbone=dict(conditioning=dict(control='norm_matched')))
