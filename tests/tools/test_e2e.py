"""End-to-end runs of the tools on the demo configs, on a small shapes dataset made by the test session."""
import glob
import json
import os.path as osp
import pickle

import pytest
import torch
from mmengine.config import Config
from mmengine.runner import Runner
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from condtok_mm.utils import fall_back_from_amp_on_cpu
from helpers.cfg_options import cfg_options_dict, data_options
from helpers.repo import DEMO, REPO_ROOT, run_tool

VITDET_DEMO = osp.join(REPO_ROOT, 'configs', 'demo', 'mask-rcnn_vit-mini-vitdet-condtok_simple-fpn_12e_shapes.py')


@pytest.mark.parametrize('config', [DEMO, VITDET_DEMO], ids=osp.basename)
@pytest.mark.slow
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
    # ViTDet's recipe asks for AMP: it gets it on a GPU, float32 (with a warning) on a CPU
    asks_for_amp = Config.fromfile(config).optim_wrapper.type == 'AmpOptimWrapper'
    assert asks_for_amp == (config == VITDET_DEMO)
    expected = 'AmpOptimWrapper' if asks_for_amp and torch.cuda.is_available() else 'OptimWrapper'
    assert type(runner.optim_wrapper).__name__ == expected
    losses = runner.message_hub.get_scalar('train/loss').current()
    assert torch.isfinite(torch.tensor(losses))
    changed = [k for k, v in runner.model.state_dict().items() if not torch.equal(v, before[k])]
    assert any(k.startswith('backbone.patch_embed') for k in changed)
    assert any(k.startswith('roi_head.mask_head') for k in changed)


AMP_WARNING = 'AMP needs a GPU and none is available: training in float32 with OptimWrapper instead.'


@pytest.mark.slow
@pytest.mark.parametrize('config, amp_flag', [(VITDET_DEMO, []), (DEMO, ['--amp'])], ids=['amp-config', '--amp'])
def test_train_tool_asked_for_amp_uses_it_on_a_gpu_and_float32_with_a_warning_without(shapes_root, tmp_path,
                                                                                       config, amp_flag):
    log = run_tool('train.py', config, *amp_flag, '--work-dir', str(tmp_path), '--cfg-options',
                   *data_options(shapes_root, 1), 'train_dataloader.dataset.indices=4', 'train_cfg.val_interval=2')
    assert 'Epoch(train) [1][1/1]' in log
    # AmpOptimWrapper saves its loss scaler with the optimizer state; OptimWrapper has none
    optimizer_state = torch.load(tmp_path / 'epoch_1.pth', weights_only=False)['optimizer']
    if torch.cuda.is_available():
        assert AMP_WARNING not in log and 'loss_scaler' in optimizer_state
    else:
        assert AMP_WARNING in log and 'loss_scaler' not in optimizer_state


COCO_METRIC_STATS = ('mAP', 'mAP_50', 'mAP_75', 'mAP_s', 'mAP_m', 'mAP_l')  # CocoMetric's first 6 of 12


def pycocotools_stats(ann_file, predictions, iou_type):
    """The 12 COCO statistics of tools/test.py's dumped predictions (--out), evaluated by pycocotools as
    CocoMetric evaluates them: label i is the i-th category, xywh boxes, RLE masks without boxes (areas from
    the masks), up to 100/300/1000 detections per image."""
    coco_gt = COCO(ann_file)
    cat_ids = coco_gt.getCatIds()
    detections = []
    for prediction in predictions:
        instances = prediction['pred_instances']
        for index, (box, score, label) in enumerate(zip(instances['bboxes'].tolist(), instances['scores'].tolist(),
                                                        instances['labels'].tolist())):
            detection = dict(image_id=prediction['img_id'], category_id=cat_ids[label], score=score)
            if iou_type == 'bbox':
                detection['bbox'] = [box[0], box[1], box[2] - box[0], box[3] - box[1]]
            else:
                rle = instances['masks'][index]
                detection['segmentation'] = dict(size=rle['size'], counts=rle['counts'].decode())
            detections.append(detection)
    evaluation = COCOeval(coco_gt, coco_gt.loadRes(detections), iou_type)
    evaluation.params.catIds, evaluation.params.imgIds = cat_ids, [p['img_id'] for p in predictions]
    evaluation.params.maxDets = [100, 300, 1000]
    evaluation.evaluate(), evaluation.accumulate(), evaluation.summarize()
    return evaluation.stats


@pytest.mark.slow
def test_short_training_then_test_gives_coco_metrics(shapes_root, trained_checkpoint, tmp_path):
    work_dir = tmp_path / 'train'
    run_tool('train.py', DEMO, '--work-dir', str(work_dir), '--cfg-options', *data_options(shapes_root, 2))
    checkpoint = torch.load(work_dir / 'epoch_2.pth', weights_only=False)
    assert (checkpoint['meta']['epoch'], checkpoint['meta']['iter']) == (2, 8)  # 16 images, batch 4
    # tested: a model trained until its AP is clearly above 0, so that the numbers compared are not all 0
    log = run_tool('test.py', DEMO, trained_checkpoint, '--work-dir', str(tmp_path / 'test'), '--show-dir',
                   'vis', '--out', str(tmp_path / 'preds.pkl'), '--cfg-options', *data_options(shapes_root, 2))
    assert 'Average Precision  (AP) @[ IoU=0.50:0.95 | area=   all | maxDets=100 ]' in log
    (metrics_file, ) = glob.glob(str(tmp_path / 'test' / '*' / '*.json'))
    metrics = json.load(open(metrics_file))
    predictions = pickle.load(open(tmp_path / 'preds.pkl', 'rb'))
    assert [p['img_id'] for p in predictions] == list(range(1, 9))
    ann_file = osp.join(shapes_root, 'annotations', 'instances_val.json')
    for task in ('bbox', 'segm'):
        stats = pycocotools_stats(ann_file, predictions, task)
        # the tool's numbers (faster-coco-eval's, rounded to 3 decimals) are pycocotools' on its predictions
        for name, value in zip(COCO_METRIC_STATS, stats):
            assert metrics[f'coco/{task}_{name}'] == pytest.approx(value, abs=6e-4), (task, name)
    assert metrics['coco/bbox_mAP'] > 0  # the trained model finds boxes: the numbers compared are not all 0
    assert len(glob.glob(str(tmp_path / 'test' / '*' / 'vis' / '*.png'))) == 8
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
