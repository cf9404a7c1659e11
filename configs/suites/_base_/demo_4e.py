# The demo study's common part: seeds, learning rates and a 4-epoch schedule (200 iterations on data/shapes at
# 4 images a batch) that lets a suite of ~60 cells finish in about 1.5 hours on 2 CPU cores (2 cells at a
# time, 1 thread each). The demo's own 12 epochs (warm-up 100 iterations, x0.1 after epochs 9 and 11) are
# cut, not the cells: warm-up 50 iterations, then the peak rate to the end. (A 3-epoch schedule with a decay
# for its last epoch left every variant on the loss plateau at ~2.05 that the baseline showed in earlier
# runs, with bbox AP 0.2-1.1 for all: too short to tell anything apart.)
seeds = [0, 1, 2]
lrs = [2.5e-4, 5e-4, 1e-3, 2e-3]
lr_key = 'optim_wrapper.optimizer.lr'
metric = 'coco/bbox_mAP'
cfg_options = {
    'train_cfg.max_epochs': 4,
    'train_cfg.val_interval': 5,  # no evaluation while training: tools/test.py evaluates the final checkpoint
    'param_scheduler.0.end': 50,
    'param_scheduler.1.end': 4,
    'param_scheduler.1.milestones': [4],  # at the end: no decay inside the run
    'default_hooks.checkpoint.interval': 1,  # an interrupted cell resumes from its last epoch
    'default_hooks.checkpoint.max_keep_ckpts': 1,
    'custom_hooks.0.interval': 25,  # AttentionConditioningHook: kappa curves at 9 points
}
