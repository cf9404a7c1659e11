# Protocol P1-norm: the conditioned Swin-T Mask R-CNN 1x (P1: mmdet's ImageNet Swin-T, pretrained
# without conditioning, fine-tuned with it) with control='norm_matched': the tokens (X + C) / r,
# r = ||X + C||_F / ||X||_F, so kappa <= 2 at the token scale the pretrained weights know.
_base_ = './mask-rcnn_swin-t-p4-w7-condtok_fpn_1x_coco.py'

model = dict(backbone=dict(conditioning=dict(control='norm_matched')))
