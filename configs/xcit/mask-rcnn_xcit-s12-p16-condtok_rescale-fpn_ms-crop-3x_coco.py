# Mask R-CNN with XCiT-S12/16 and conditioned embedded tokens: the baseline twin's backbone wrapped so that its
# patch-embedding output is conditioned (kappa <= 2) before the first XCA block.
_base_ = './mask-rcnn_xcit-s12-p16_rescale-fpn_ms-crop-3x_coco.py'

model = dict(
    # mmdet's DetDataPreprocessor that also records each image's unpadded size, so that every image is
    # conditioned on its own tokens and not on the padding its batch-mates force.
    data_preprocessor=dict(type='ValidRegionDetDataPreprocessor'),
    backbone=dict(
        _delete_=True,
        type='CondTokBackbone',
        backbone={{_base_.model.backbone}},
        conditioning=dict(type='TokenConditioner', mode='sigma_max', alpha=1.0, target_kappa=2.0,
                          detach=True),
        targets=('patch_embed', )))
