# The decisive study's common part: the demo's own 12-epoch schedule (600 iterations on data/shapes at
# 4 images a batch; warm-up 100 iterations, x0.1 after epochs 9 and 11: the configs' own, not overridden),
# evaluated on 200 validation images, with validations during training at epochs 3 and 6 (mmengine validates
# the last epoch too) and a checkpoint each epoch, so that an interrupted cell resumes (run_suite.py --resume).
# The data, once (the same 200 training images as data/shapes/, the same first 50 validation images):
#   python tools/dataset/make_shapes.py --out-dir data/shapes_val200/ --num-val 200
_data = 'data/shapes_val200/'
metric = 'coco/bbox_mAP'
lr_key = 'optim_wrapper.optimizer.lr'
cfg_options = {
    'train_dataloader.dataset.data_root': _data,
    'val_dataloader.dataset.data_root': _data,
    'test_dataloader.dataset.data_root': _data,
    'val_evaluator.ann_file': _data + 'annotations/instances_val.json',
    'test_evaluator.ann_file': _data + 'annotations/instances_val.json',
    'train_cfg.val_interval': 3,
    # no validation after epoch 6 but mmengine's last-epoch one: its loop takes the interval of epoch e + 1 after
    # epoch e (mmengine/runner/loops.py, _decide_current_val_interval), so the switch is at 8 for 6 to validate
    'train_cfg.dynamic_intervals': [(8, 100)],
    'default_hooks.checkpoint.interval': 1,
    'default_hooks.checkpoint.max_keep_ckpts': 1,
    'custom_hooks.0.interval': 50,  # AttentionConditioningHook: kappa curves at 12 points
}
