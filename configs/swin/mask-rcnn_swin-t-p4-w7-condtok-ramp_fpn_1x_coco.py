# Protocol P1-ramp: the conditioned Swin-T Mask R-CNN 1x (P1: mmdet's ImageNet Swin-T, pretrained
# without conditioning, fine-tuned with it) with the correction's strength ramped linearly from 0 to 1 over the
# first 1000 iterations (the recipe's learning-rate warm-up), so that the pretrained weights first see the tokens
# they were trained on. Validation and testing always run at full strength. Cosine:
# --cfg-options custom_hooks.1.shape=cosine.
_base_ = './mask-rcnn_swin-t-p4-w7-condtok_fpn_1x_coco.py'

custom_hooks = [
    dict(type='AttentionKappaHook', interval=50),
    dict(type='ConditioningStrengthRampHook', length=1000, shape='linear'),
]
