#!/bin/bash
# The decisive study's B_conditioned seed-3 cell, trained and tested twice at one commit on one machine.
cd /work/studies/tree
PY=/work/main/.venv/bin/python
OPTS="randomness.seed=3 optim_wrapper.optimizer.lr=0.001 train_dataloader.dataset.data_root=data/shapes_val200/ val_dataloader.dataset.data_root=data/shapes_val200/ test_dataloader.dataset.data_root=data/shapes_val200/ val_evaluator.ann_file=data/shapes_val200/annotations/instances_val.json test_evaluator.ann_file=data/shapes_val200/annotations/instances_val.json train_cfg.val_interval=3 train_cfg.dynamic_intervals=[(8,100)] default_hooks.checkpoint.interval=1 default_hooks.checkpoint.max_keep_ckpts=1 custom_hooks.0.interval=50"
CFG=configs/demo/mask-rcnn_swin-mini-condtok_fpn_12e_shapes.py
run() {
  W=/work/studies/repeat/run$1
  mkdir -p $W
  OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONPATH=$PWD $PY tools/train.py $CFG --work-dir $W --cfg-options $OPTS > $W/train.log 2>&1
  OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONPATH=$PWD $PY tools/test.py $CFG $W/epoch_12.pth --work-dir $W/test --cfg-options $OPTS > $W/test.log 2>&1
  echo "run$1 done $(date)"
}
run 1 & run 2 & wait
