# Protocol P1-ramp at the demo scale: P1 (configs/demo/mask-rcnn_swin-mini-condtok-pretrained_fpn_12e_shapes.py)
# with the correction's strength ramped linearly from 0 to 1 over the first 100 iterations (the learning rate's
# warm-up), so that the pretrained weights first see the tokens they were trained on. Evaluation always runs
# at full strength. Cosine: --cfg-options custom_hooks.1.shape=cosine.
_base_ = './mask-rcnn_swin-mini-condtok-pretrained_fpn_12e_shapes.py'

custom_hooks = [
    dict(type='AttentionKappaHook', interval=50),
    dict(type='ConditioningStrengthRampHook', length=100, shape='linear'),
]
