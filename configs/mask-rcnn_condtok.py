# The headline config: Mask R-CNN, Swin-T, FPN, 1x, COCO instance segmentation, conditioned embedded tokens.
#   python tools/train.py configs/mask-rcnn_condtok.py
# Its baseline twin is configs/swin/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py.
_base_ = './swin/mask-rcnn_swin-t-p4-w7-condtok_fpn_1x_coco.py'
