# The controls on COCO: Swin-T Mask R-CNN 1x (mmdet's recipe: lr 1e-4 for 16 GPUs x 2 images), baseline,
# conditioned tokens and the two token-scale controls, 3 seeds at the recipe's rate and half and twice it.
# Needs data/coco and GPUs, e.g. 16 GPUs a cell through SLURM (the recipe's batch, 16 x 2 images):
#   python tools/suites/run_suite.py configs/suites/coco_controls_swin-t_1x.py --launcher slurm \
#       --partition PARTITION --nproc 16 --jobs 4
seeds = [0, 1, 2]
lrs = [5e-5, 1e-4, 2e-4]
lr_key = 'optim_wrapper.optimizer.lr'
metric = 'coco/bbox_mAP'
cfg_options = {}
description = 'Swin-T Mask R-CNN 1x on COCO: A baseline, B conditioned tokens, C scale-matched, D norm-matched.'
reference = 'A_baseline'
_conditioned = 'configs/swin/mask-rcnn_swin-t-p4-w7-condtok_fpn_1x_coco.py'
variants = dict(
    A_baseline=dict(config='configs/swin/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py', description='no conditioning'),
    B_conditioned=dict(config=_conditioned, description="X + C, mode='sigma_max', kappa <= 2"),
    C_scale_matched=dict(config=_conditioned, cfg_options={'model.backbone.conditioning.control': 'scale_matched'},
                         description='r X'),
    D_norm_matched=dict(config=_conditioned, cfg_options={'model.backbone.conditioning.control': 'norm_matched'},
                        description='(X + C) / r'),
)
