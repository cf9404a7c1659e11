# The NEON baseline plus the conditioning (the same lines as configs/demo/mask-rcnn_swin-mini-condtok_fpn_12e_shapes.py
# adds to its twin): kappa(X + C) <= 2 for the embedded tokens of each image.
_base_ = './faster-rcnn_swin-mini_fpn_400e_neon-trees.py'

model = dict(
    # records each image's unpadded size, so that every image is conditioned on its own tokens
    data_preprocessor=dict(type='ValidRegionDetDataPreprocessor'),
    backbone=dict(
        type='CondSwinTransformer',
        conditioning=dict(type='TokenConditioner', mode='sigma_max', alpha=1.0, target_kappa=2.0,
                          detach=True),
        condition_stages=(0, )))
