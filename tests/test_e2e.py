"""End-to-end runs of the tools on the demo configs, on a small shapes dataset made by the test session."""
import glob
import json
import os.path as osp

import pytest
import torch
from mmengine.config import Config
from mmengine.runner import Runner

from condtok_mm.utils import fall_back_from_amp_on_cpu
from conftest import DEMO, REPO_ROOT, cfg_options_dict, data_options, run_tool

VITDET_DEMO = osp.join(REPO_ROOT, 'configs', 'demo', 'mask-rcnn_vit-mini-vitdet-condtok_simple-fpn_12e_shapes.py')


@pytest.mark.parametrize('config', [DEMO, VITDET_DEMO], ids=osp.basename)
def test_one_training_step_of_the_demo_config(shapes_root, tmp_path, config):
    cfg = Config.fromfile(config)
    fall_back_from_amp_on_cpu(cfg)  # as the tools do: ViTDet's recipe asks for AMP, which needs a GPU
    cfg.merge_from_dict(cfg_options_dict(data_options(shapes_root, 1)))
    cfg.train_dataloader.dataset.indices = 4  # one batch of 4 images: one iteration
    cfg.val_cfg = cfg.val_dataloader = cfg.val_evaluator = None
    cfg.train_cfg.val_interval = 1
    cfg.work_dir = str(tmp_path)
    runner = Runner.from_cfg(cfg)
    before = {k: v.clone() for k, v in runner.model.state_dict().items()}
    runner.train()
    assert runner.iter == 1
    assert type(runner.optim_wrapper).__name__ == 'OptimWrapper'
    losses = runner.message_hub.get_scalar('train/loss').current()
    assert torch.isfinite(torch.tensor(losses))
    changed = [k for k, v in runner.model.state_dict().items() if not torch.equal(v, before[k])]
    assert any(k.startswith('backbone.patch_embed') for k in changed)
    assert any(k.startswith('roi_head.mask_head') for k in changed)


@pytest.mark.slow
def test_short_training_then_test_gives_coco_metrics(shapes_root, tmp_path):
    work_dir = tmp_path / 'train'
    run_tool('train.py', DEMO, '--work-dir', str(work_dir), '--cfg-options', *data_options(shapes_root, 2))
    checkpoint = work_dir / 'epoch_2.pth'
    assert checkpoint.exists()
    log = run_tool('test.py', DEMO, str(checkpoint), '--work-dir', str(tmp_path / 'test'), '--show-dir',
                   'vis', '--out', str(tmp_path / 'preds.pkl'), '--cfg-options',
                   *data_options(shapes_root, 2))
    assert 'Average Precision  (AP) @[ IoU=0.50:0.95 | area=   all | maxDets=100 ]' in log
    (metrics_file, ) = glob.glob(str(tmp_path / 'test' / '*' / '*.json'))
    metrics = json.load(open(metrics_file))
    for task in ('bbox', 'segm'):
        assert 0 <= metrics[f'coco/{task}_mAP'] <= 1
    assert len(glob.glob(str(tmp_path / 'test' / '*' / 'vis' / '*.png'))) == 8
    assert (tmp_path / 'preds.pkl').exists()
    summary = run_tool('analysis/summarize_test.py', str(tmp_path / 'test'))
    assert f'bbox   {100 * metrics["coco/bbox_mAP"]:6.1f}' in summary


@pytest.mark.slow
def test_resume_continues_a_run(shapes_root, tmp_path):
    run_tool('train.py', DEMO, '--work-dir', str(tmp_path), '--cfg-options', *data_options(shapes_root, 1))
    first = torch.load(tmp_path / 'epoch_1.pth', weights_only=False)
    log = run_tool('train.py', DEMO, '--work-dir', str(tmp_path), '--resume', '--cfg-options',
                   *data_options(shapes_root, 2))
    assert 'resumed epoch: 1, iter: 4' in log  # 16 images, batch 4
    assert 'Epoch(train) [2][4/4]' in log and 'Epoch(train) [1]' not in log
    second = torch.load(tmp_path / 'epoch_2.pth', weights_only=False)
    assert (second['meta']['epoch'], second['meta']['iter']) == (2, 8)
    assert not torch.equal(first['state_dict']['backbone.patch_embed.projection.weight'],
                           second['state_dict']['backbone.patch_embed.projection.weight'])
    # load_from a checkpoint (torch >= 2.6 weights_only default) works through tools/test.py as well
    run_tool('test.py', DEMO, str(tmp_path / 'epoch_2.pth'), '--work-dir', str(tmp_path / 'test'),
             '--cfg-options', *data_options(shapes_root, 2))
