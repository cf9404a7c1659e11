# The paper's XCiT pairs on COCO: Mask R-CNN with XCiT-S12/16 and XCiT-M24/16 (3x, multi-scale crop), baseline
# and conditioned tokens (CondTokBackbone around mmpretrain's XCiT), 3 seeds at the recipe's rate; each
# conditioned variant is compared with its own baseline twin (the same architecture). Needs data/coco, GPUs and
# the ImageNet checkpoints the configs name, e.g.:
#   python tools/suites/run_suite.py configs/suites/coco_pairs_xcit.py --launcher slurm \
#       --partition PARTITION --nproc 8 --jobs 4
seeds = [0, 1, 2]
lrs = [1e-4]
lr_key = 'optim_wrapper.optimizer.lr'
metric = 'coco/bbox_mAP'
cfg_options = {}
description = ('XCiT-S12 and XCiT-M24 Mask R-CNN 3x on COCO, baseline and conditioned tokens, each conditioned '
               'variant against its own baseline (the paper reports box AP XCiT-S 44.9 -> 45.7 and XCiT-M '
               '45.7 -> 46.2; the spectral-conditioning paper XCiT-S 44.9 -> 45.6).')
reference = 'S12_baseline'
family = ['S12_conditioned', 'M24_conditioned']
variants = dict(
    S12_baseline=dict(config='configs/xcit/mask-rcnn_xcit-s12-p16_rescale-fpn_ms-crop-3x_coco.py',
                      description='XCiT-S12, no conditioning'),
    S12_conditioned=dict(config='configs/xcit/mask-rcnn_xcit-s12-p16-condtok_rescale-fpn_ms-crop-3x_coco.py',
                         reference='S12_baseline', description='XCiT-S12, conditioned tokens'),
    M24_baseline=dict(config='configs/xcit/mask-rcnn_xcit-m24-p16_rescale-fpn_ms-crop-3x_coco.py',
                      reference=None, description='XCiT-M24, no conditioning'),
    M24_conditioned=dict(config='configs/xcit/mask-rcnn_xcit-m24-p16-condtok_rescale-fpn_ms-crop-3x_coco.py',
                         reference='M24_baseline', description='XCiT-M24, conditioned tokens'),
)
