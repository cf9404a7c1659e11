# Protocol P0 at the demo scale: the baseline demo detector fine-tuned from the mini-Swin pretrained
# WITHOUT conditioning on the shapes classification task (configs/demo/swin-mini_1xb32-20e_shapes-cls.py, whose
# backbone has the same state-dict keys as this one). Pretrain first, or give the checkpoint:
#   python tools/train.py configs/demo/swin-mini_1xb32-20e_shapes-cls.py
#   python tools/train.py configs/demo/mask-rcnn_swin-mini-pretrained_fpn_12e_shapes.py \
#       [--cfg-options model.backbone.init_cfg.checkpoint=PATH]
_base_ = './mask-rcnn_swin-mini_fpn_12e_shapes.py'

model = dict(
    backbone=dict(
        # mmdet's SwinTransformer.init_weights reads the checkpoint's backbone.* keys itself (the classifier's
        # backbone.*; its head is left out)
        init_cfg=dict(_delete_=True,  # the base's is None
                      type='Pretrained', checkpoint='work_dirs/swin-mini_1xb32-20e_shapes-cls/epoch_20.pth')))
