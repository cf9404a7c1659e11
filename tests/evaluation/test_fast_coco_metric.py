"""FastCocoMetric against mmdet's CocoMetric on the shapes dataset, with faster-coco-eval and without it."""
import copy
import json
import os.path as osp
import subprocess
import sys

import numpy as np
import pytest
import torch
from mmdet.datasets.api_wrappers import COCO as PycocotoolsCOCO
from mmdet.evaluation.metrics import CocoMetric
from mmdet.evaluation.metrics import coco_metric as coco_metric_module
from mmdet.registry import METRICS
from pycocotools import mask as mask_utils
from pycocotools.cocoeval import COCOeval as PycocotoolsCOCOeval

import condtok_mm  # noqa: F401
from condtok_mm.datasets import SHAPE_CLASSES, make_shapes_dataset
from condtok_mm.evaluation import FastCocoMetric
from helpers.repo import REPO_ROOT

METRIC_TYPES = ['bbox', 'segm', 'proposal']


def predictions_for(ann_file, seed=0):
    """mmdet data samples whose predictions are imperfect copies of the ground truth plus false positives.

    Boxes are jittered, masks shifted, some labels swapped, some objects missed, some detected twice; scores
    are random, so every COCO statistic (AP at each IoU, per area, at 100 and 1000 detections per image) is
    somewhere between 0 and 1.
    """
    rng = np.random.default_rng(seed)
    coco = json.load(open(ann_file))
    anns_of = {img['id']: [] for img in coco['images']}
    for ann in coco['annotations']:
        anns_of[ann['image_id']].append(ann)
    samples = []
    for img in coco['images']:
        height, width = img['height'], img['width']
        boxes, labels, masks, scores = [], [], [], []
        for ann in anns_of[img['id']]:
            for _ in range(int(rng.choice([0, 1, 1, 1, 2]))):  # missed, found, found twice
                mask = mask_utils.decode(ann['segmentation']).astype(bool)
                masks.append(np.roll(mask, tuple(rng.integers(-3, 4, size=2)), axis=(0, 1)))
                x, y, w, h = ann['bbox']
                boxes.append(np.array([x, y, x + w, y + h]) + rng.normal(0, 0.08 * max(w, h), size=4))
                swapped = rng.random() > 0.85
                labels.append(int(rng.integers(len(SHAPE_CLASSES))) if swapped else ann['category_id'] - 1)
                scores.append(rng.uniform(0.05, 1))
        # False positives. The first image gets 150 of its first object's class, scored above all its true
        # positives: COCO's mAP (at 100 detections per image and class) misses them, AP at 1000 does not.
        flood = not samples
        for _ in range(150 if flood else int(rng.integers(0, 4))):
            x, y = rng.uniform(0, width - 20), rng.uniform(0, height - 20)
            w, h = rng.uniform(8, width - x), rng.uniform(8, height - y)
            mask = np.zeros((height, width), dtype=bool)
            mask[int(y):int(y + h), int(x):int(x + w)] = True
            boxes.append(np.array([x, y, x + w, y + h])), masks.append(mask)
            labels.append(anns_of[img['id']][0]['category_id'] - 1 if flood else
                          int(rng.integers(len(SHAPE_CLASSES))))
            scores.append(rng.uniform(1, 2) if flood else rng.uniform(0.05, 1))
        pred = dict(bboxes=torch.tensor(np.array(boxes), dtype=torch.float32).reshape(-1, 4),
                    scores=torch.tensor(scores, dtype=torch.float32),
                    labels=torch.tensor(labels, dtype=torch.int64),
                    masks=torch.tensor(np.array(masks)).reshape(-1, height, width))
        samples.append(dict(img_id=img['id'], ori_shape=(height, width), pred_instances=pred))
    return samples


def evaluate(metric, samples):
    metric.dataset_meta = dict(classes=SHAPE_CLASSES)
    metric.process({}, samples)
    return metric.evaluate(len(samples))


@pytest.fixture(scope='module')
def ann_file(tmp_path_factory):
    # 320 x 320 images: the shapes span COCO's small, medium and large areas
    root = str(tmp_path_factory.mktemp('shapes320'))
    return make_shapes_dataset(root, num_train=0, num_val=12, image_size=(320, 320), seed=5)['val']


@pytest.fixture(scope='module')
def samples(ann_file):
    return predictions_for(ann_file)


@pytest.fixture(scope='module')
def coco_metric_results(ann_file, samples):
    return evaluate(CocoMetric(ann_file=ann_file, metric=METRIC_TYPES, classwise=True), samples)


@pytest.mark.slow
def test_fast_coco_metric_reports_what_coco_metric_reports(ann_file, samples, coco_metric_results):
    metric = METRICS.build(
        dict(type='FastCocoMetric', ann_file=ann_file, metric=METRIC_TYPES, classwise=True))
    results = evaluate(metric, samples)
    assert type(metric._coco_api).__module__.startswith('faster_coco_eval')
    assert results.keys() == coco_metric_results.keys()
    # 6 for each of bbox, segm and proposal, and one per class (classwise: segm overwrites bbox's)
    assert len(results) == 3 * 6 + len(SHAPE_CLASSES)
    for key, value in coco_metric_results.items():
        assert results[key] == pytest.approx(value, abs=1e-4), key
    for task in ('bbox', 'segm'):
        for size in ('s', 'm', 'l'):
            assert 0.05 < results[f'coco/{task}_mAP_{size}'] < 0.95
    # CocoMetric's module sees pycocotools again once FastCocoMetric is done
    assert coco_metric_module.COCO is PycocotoolsCOCO and coco_metric_module.COCOeval is PycocotoolsCOCOeval


@pytest.mark.parametrize('iou_type', ['bbox', 'segm'])
def test_faster_coco_eval_statistics_match_pycocotools_unrounded(ann_file, samples, iou_type, tmp_path):
    # CocoMetric rounds to 3 decimals; compare the 12 statistics and the precision array themselves.
    from condtok_mm.evaluation.faster_coco_api import COCO, COCOeval
    metric = CocoMetric(ann_file=ann_file, outfile_prefix=str(tmp_path / 'preds'))
    metric.dataset_meta = dict(classes=SHAPE_CLASSES)
    metric.process({}, samples)
    gts, preds = zip(*metric.results)
    metric.cat_ids, metric.img_ids = [1, 2, 3, 4], [s['img_id'] for s in samples]
    detections = json.load(open(metric.results2json(preds, str(tmp_path / 'preds'))[iou_type]))
    if iou_type == 'segm':
        for det in detections:
            det.pop('bbox')  # as CocoMetric does: areas from the masks

    evaluations = []
    for coco_cls, cocoeval_cls in ((PycocotoolsCOCO, PycocotoolsCOCOeval), (COCO, COCOeval)):
        coco_gt = coco_cls(ann_file)
        # loadRes adds keys to the detections it is given
        evaluation = cocoeval_cls(coco_gt, coco_gt.loadRes(copy.deepcopy(detections)), iou_type)
        evaluation.params.maxDets = [100, 300, 1000]
        evaluation.evaluate(), evaluation.accumulate(), evaluation.summarize()
        evaluations.append(evaluation)
    reference, fast = evaluations
    np.testing.assert_allclose(fast.stats, reference.stats, atol=1e-4)
    np.testing.assert_allclose(fast.eval['precision'], reference.eval['precision'], atol=1e-4)
    assert len(fast.stats) == 12 and reference.stats[0] > 0


def test_falls_back_to_pycocotools_with_a_warning(ann_file, samples, coco_metric_results, monkeypatch):
    monkeypatch.setitem(sys.modules, 'faster_coco_eval', None)  # `import faster_coco_eval` raises ImportError
    monkeypatch.delitem(sys.modules, 'condtok_mm.evaluation.faster_coco_api', raising=False)
    with pytest.warns(UserWarning, match='faster-coco-eval cannot be imported.*pip install faster-coco-eval'):
        metric = FastCocoMetric(ann_file=ann_file, metric=METRIC_TYPES, classwise=True)
    results = evaluate(metric, samples)
    assert isinstance(metric._coco_api, PycocotoolsCOCO)
    assert results == coco_metric_results


def test_bad_arguments_get_errors_that_say_the_fix(ann_file):
    with pytest.raises(ValueError, match='use_mp_eval.*Remove use_mp_eval'):
        FastCocoMetric(ann_file=ann_file, use_mp_eval=True)
    with pytest.raises(ValueError, match=r'proposal_nums=\(10, 20, 50\) must contain 100'):
        FastCocoMetric(ann_file=ann_file, proposal_nums=(10, 20, 50))


@pytest.mark.slow
def test_eval_speed_benchmark_times_both_metrics_and_finds_the_same_numbers(tmp_path):
    result = subprocess.run([sys.executable, osp.join(REPO_ROOT, 'tools', 'benchmark', 'eval_speed.py'),
                             '--num-images', '30', '--dets-per-image', '20', '--out-dir', str(tmp_path)],
                            capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.load(open(tmp_path / 'eval_speed.json'))
    assert [row['task'] for row in summary['rows']] == ['bbox', 'segm']
    for row in summary['rows']:
        assert row['num_predictions'] == 30 * 20 and row['max_metric_difference'] == 0
        assert row['speedup'] == row['CocoMetric_s'] / row['FastCocoMetric_s']
    assert summary['machine']['cpu'] and summary['machine']['faster-coco-eval']
    assert (tmp_path / 'eval_speed.png').read_bytes()[:4] == b'\x89PNG'
    assert 'bbox + segm' in result.stdout and 'machine:' in result.stdout
    # 2 processes (the default --processes 1 2): each rank holds half of the predictions, rank 0 gathers
    assert sorted((row['task'], row['processes']) for row in summary['processes']) == [('bbox', 2), ('segm', 2)]
    single_process_seconds = {row['task']: row['FastCocoMetric_s'] for row in summary['rows']}
    for row in summary['processes']:
        assert row['max_metric_difference_to_single'] == 0
        assert row['single_process_s'] == single_process_seconds[row['task']]
