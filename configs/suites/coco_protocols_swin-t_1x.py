# The protocols on COCO: Swin-T Mask R-CNN 1x (mmdet's recipe: lr 1e-4 for 16 GPUs x 2 images), the rate chosen on seed 0 among
# the recipe's rate and half and twice it. P0-P1-norm start from mmdet's public ImageNet Swin-T (pretrained without
# conditioning, the original repository's keys: convert_weights=True). P2 starts from a Swin-T pretrained WITH
# conditioning by mmpretrain (configs/classification/swin-tiny-condtok_16xb64_in1k.py, mmdet's Swin keys: so
# convert_weights=False), given in the environment of run_suite.py:
#   python tools/train.py configs/classification/swin-tiny-condtok_16xb64_in1k.py  # or mmpretrain's tools, 16 GPUs
#   CONDTOK_P2_CHECKPOINT=work_dirs/swin-tiny-condtok_16xb64_in1k/epoch_300.pth \
#   python tools/suites/run_suite.py configs/suites/coco_protocols_swin-t_1x.py --launcher slurm \
#       --partition PARTITION --nproc 16 --jobs 4
# mmpretrain's Swin-T outputs the last stage only (out_indices=(3,)), so the detector's output norms of stages 0-2
# (backbone.norm0-norm2) are not in that checkpoint and keep their initialisation, as with mmdet's public one.
description = ('Swin-T Mask R-CNN 1x on COCO: P0 baseline, P1 drop-in conditioning, P1-ramp (strength 0 -> 1 over '
               '1000 iterations), P1-norm (norm-matched) from the public unconditioned ImageNet Swin-T; P2 from a '
               'conditioned ImageNet Swin-T.')
reference = 'P0_baseline'
# each arm's learning rate is chosen on seed 0 (every rate), then reported on seeds 1-3 at that rate
selection_seeds = [0]
seeds = [1, 2, 3]
lrs = [5e-5, 1e-4, 2e-4]
lr_key = 'optim_wrapper.optimizer.lr'
metric = 'coco/bbox_mAP'
cfg_options = {}
_conditioned = 'configs/swin/mask-rcnn_swin-t-p4-w7-condtok_fpn_1x_coco.py'
variants = dict(
    P0_baseline=dict(config='configs/swin/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py',
                     description='unconditioned pretraining (public Swin-T), unconditioned fine-tuning'),
    P1_drop_in=dict(config=_conditioned,
                    description='unconditioned pretraining, conditioned fine-tuning from iteration 0'),
    P1_ramp=dict(config='configs/swin/mask-rcnn_swin-t-p4-w7-condtok-ramp_fpn_1x_coco.py',
                 description='P1 with the strength ramped linearly 0 -> 1 over the first 1000 iterations'),
    P1_norm=dict(config='configs/swin/mask-rcnn_swin-t-p4-w7-condtok-norm_fpn_1x_coco.py',
                 description="P1 with control='norm_matched': (X + C) / r, kappa <= 2 at X's scale"),
    P2_conditioned_pretraining=dict(
        config=_conditioned,
        cfg_options={'model.backbone.init_cfg.checkpoint':
                     '{{$CONDTOK_P2_CHECKPOINT:work_dirs/swin-tiny-condtok_16xb64_in1k/epoch_300.pth}}',
                     'model.backbone.convert_weights': False},
        description='conditioned ImageNet pretraining (mmpretrain), conditioned fine-tuning'),
)
