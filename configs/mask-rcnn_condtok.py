# The headline config: Mask R-CNN, Swin-T, FPN, 1x, COCO instance segmentation, conditioned embedded tokens,
# fine-tuned from mmdet's unconditioned ImageNet Swin-T with kappa <= 2 held at the tokens' own scale
# (control='norm_matched', protocol P1-norm): the protocol the demo-scale protocol study supports for public
# unconditioned weights (docs/en/user_guides/protocols.md). The paper's plain form is the `-condtok` twin,
# configs/swin/mask-rcnn_swin-t-p4-w7-condtok_fpn_1x_coco.py.
#   python tools/train.py configs/mask-rcnn_condtok.py
# Its baseline twin is configs/swin/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py.
_base_ = './swin/mask-rcnn_swin-t-p4-w7-condtok-norm_fpn_1x_coco.py'
