# ViTDet Mask R-CNN, ViT-B (MAE), LSJ 1024, 100 epochs on COCO, with conditioned embedded tokens: the baseline
# twin plus the conditioning of the patch-embedding output (before the position embedding), one token matrix
# per image. Per-window conditioning (each 14 x 14 window of the first block on its own) is one more line:
#   --cfg-options model.backbone.conditioning.scope=window
_base_ = './mask-rcnn_vit-b-vitdet_simple-fpn_lsj-100e_coco.py'

model = dict(
    # mmdet's DetDataPreprocessor that also records each image's unpadded size, so that every image is
    # conditioned on its own tokens and not on the padding its batch-mates force.
    data_preprocessor=dict(type='ValidRegionDetDataPreprocessor'),
    backbone=dict(
        type='CondViT',
        conditioning=dict(type='TokenConditioner', mode='sigma_max', alpha=1.0, target_kappa=2.0,
                          detach=True),
        condition_after_pos_embed=False))
