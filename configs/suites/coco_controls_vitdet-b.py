# The controls on COCO: ViTDet-B Mask R-CNN (LSJ 100 epochs = 184375 iterations at 64 images), the
# paper's main setting (a plain, globally attending ViT), baseline, conditioned tokens and the two
# token-scale controls, 3 seeds at the recipe's rate. Needs data/coco and GPUs, e.g.:
#   python tools/suites/run_suite.py configs/suites/coco_controls_vitdet-b.py --launcher slurm \
#       --partition PARTITION --nproc 16 --jobs 4
seeds = [0, 1, 2]
lrs = [1e-4]
lr_key = 'optim_wrapper.optimizer.lr'
metric = 'coco/bbox_mAP'
cfg_options = {}
description = 'ViTDet-B Mask R-CNN on COCO: A baseline, B conditioned tokens, C scale-matched, D norm-matched.'
reference = 'A_baseline'
_conditioned = 'configs/vitdet/mask-rcnn_vit-b-vitdet-condtok_simple-fpn_lsj-100e_coco.py'
variants = dict(
    A_baseline=dict(config='configs/vitdet/mask-rcnn_vit-b-vitdet_simple-fpn_lsj-100e_coco.py',
                    description='no conditioning'),
    B_conditioned=dict(config=_conditioned, description="X + C, mode='sigma_max', kappa <= 2"),
    C_scale_matched=dict(config=_conditioned, cfg_options={'model.backbone.conditioning.control': 'scale_matched'},
                         description='r X'),
    D_norm_matched=dict(config=_conditioned, cfg_options={'model.backbone.conditioning.control': 'norm_matched'},
                        description='(X + C) / r'),
)
