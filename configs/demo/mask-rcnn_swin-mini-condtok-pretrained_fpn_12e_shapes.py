# Protocol P1 (drop-in) at the demo scale: the backbone pretrained WITHOUT conditioning (as P0), fine-tuned with
# full-strength conditioning from iteration 0; the same lines as
# configs/demo/mask-rcnn_swin-mini-condtok_fpn_12e_shapes.py adds to its twin. With the conditioned pretraining's
# checkpoint it is protocol P2 (configs/demo/mask-rcnn_swin-mini-condtok-condpretrained_fpn_12e_shapes.py).
_base_ = './mask-rcnn_swin-mini-pretrained_fpn_12e_shapes.py'

model = dict(
    # mmdet's DetDataPreprocessor that also records each image's unpadded size, so that every image is
    # conditioned on its own tokens and not on the padding its batch-mates force.
    data_preprocessor=dict(type='ValidRegionDetDataPreprocessor'),
    backbone=dict(
        type='CondSwinTransformer',
        conditioning=dict(type='TokenConditioner', mode='sigma_max', alpha=1.0, target_kappa=2.0,
                          detach=True),
        condition_stages=(0, )))
