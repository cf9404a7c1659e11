"""Two-process training and evaluation through the real tools on the CPU: torchrun (tools/dist_*.sh) and
SLURM (tools/slurm_*.sh under a stand-in srun), gloo on 127.0.0.1, against one-process runs."""
import functools
import json
import os
import os.path as osp
import pickle
import re
import sys

import numpy as np
import pytest
import torch
from mmengine.config import Config
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from helpers.cfg_options import data_options
from helpers.processes import free_port
from helpers.repo import DEMO, REPO_ROOT, run_tool

FAKE_SLURM = osp.join(REPO_ROOT, 'tests', 'fake_slurm')  # srun and scontrol stand-ins for one machine


def cpu_env(**variables):
    # CUDA_VISIBLE_DEVICES='' takes the CPU (gloo) path on a machine with GPUs as well. One thread per process in
    # every run, the one-process reference included: the same arithmetic, so the same predictions to the bit.
    return {**os.environ, 'PYTHON': sys.executable, 'CUDA_VISIBLE_DEVICES': '', 'OMP_NUM_THREADS': '1', **variables}


def copypaste_lines(log):
    """The bbox_mAP_copypaste and segm_mAP_copypaste numbers CocoMetric prints, as printed."""
    return dict(re.findall(r'(bbox|segm)_mAP_copypaste: ([-\d. ]+)\n', log))


@pytest.mark.slow
def test_dist_train_runs_two_processes_on_cpu_and_scales_the_lr(shapes_root, tmp_path):
    log = run_tool('dist_train.sh', DEMO, '2', '--work-dir', str(tmp_path), '--auto-scale-lr',
                   '--cfg-options', *data_options(shapes_root, 1), 'train_dataloader.dataset.indices=8',
                   env=cpu_env(PORT=str(free_port())))
    assert 'Distributed training: True' in log
    assert 'torch.distributed uses the gloo backend instead of nccl' in log
    # 2 processes x 4 images is twice the demo's base batch size; each process trains on 4 of the 8 images
    assert ('LR is set based on batch size of 4 and the current batch size is 8. Scaling the original LR by '
            '2.0.') in log
    scaled_lr = 2 * Config.fromfile(DEMO).optim_wrapper.optimizer.lr
    # the warm-up starts at 0.01 x lr, for the lr reported as base_lr as well
    warm_up = f'{0.01 * scaled_lr:.4e}'
    assert f'Epoch(train) [1][1/1]  base_lr: {warm_up} lr: {warm_up}' in log
    checkpoint = torch.load(tmp_path / 'epoch_1.pth', weights_only=False)
    optimizer = checkpoint['optimizer']
    assert all(group['initial_lr'] == pytest.approx(scaled_lr) for group in optimizer['param_groups'])
    assert optimizer['base_param_settings']['initial_lr'] == pytest.approx(scaled_lr)
    assert len(checkpoint['message_hub']['runtime_info']['condtok_mm_random_states']) == 2  # one per rank


def first_images(shapes_root, num_images, out_dir):
    """An annotation file with the first num_images val images of the shapes dataset."""
    coco = json.load(open(osp.join(shapes_root, 'annotations', 'instances_val.json')))
    image_ids = {image['id'] for image in coco['images'][:num_images]}
    coco['images'] = [image for image in coco['images'] if image['id'] in image_ids]
    coco['annotations'] = [ann for ann in coco['annotations'] if ann['image_id'] in image_ids]
    path = osp.join(out_dir, f'instances_val_{num_images}.json')
    json.dump(coco, open(path, 'w'))
    return path


def evaluation_options(shapes_root, ann_file, out_dir):
    # One image per batch in both runs, so that every image is computed alike whichever process holds it
    # (batches of 4 and 3 images in one process against 4 and 4 in each of two may round differently). CocoMetric
    # writes the detections it evaluates, gathered from every process, to <out_dir>/coco.{bbox,segm}.json.
    return [
        f'test_dataloader.dataset.data_root={shapes_root}/', f'test_dataloader.dataset.ann_file={ann_file}',
        f'test_evaluator.ann_file={ann_file}', 'test_dataloader.num_workers=0',
        'test_dataloader.persistent_workers=False', 'test_dataloader.batch_size=1',
        f'test_evaluator.outfile_prefix={osp.join(out_dir, "coco")}'
    ]


def unrounded_coco_stats(ann_file, out_dir):
    """pycocotools' 12 statistics (not rounded) of the bbox and segm detections the run evaluated."""
    stats = {}
    for iou_type in ('bbox', 'segm'):
        coco_gt = COCO(ann_file)
        evaluation = COCOeval(coco_gt, coco_gt.loadRes(osp.join(out_dir, f'coco.{iou_type}.json')), iou_type)
        evaluation.params.maxDets = [100, 300, 1000]  # as CocoMetric sets them
        evaluation.evaluate(), evaluation.accumulate(), evaluation.summarize()
        stats[iou_type] = evaluation.stats
    return stats


@pytest.fixture(scope='module')
def single_process_test(shapes_root, trained_checkpoint, tmp_path_factory):
    """tools/test.py in one process on the first N val images: (ann_file, its output dir, printed AP numbers,
    predictions)."""

    @functools.lru_cache
    def run(num_images):
        out_dir = str(tmp_path_factory.mktemp(f'one_process_{num_images}'))
        ann_file = first_images(shapes_root, num_images, out_dir)
        log = run_tool('test.py', DEMO, trained_checkpoint, '--work-dir', out_dir, '--out',
                       osp.join(out_dir, 'predictions.pkl'), '--cfg-options',
                       *evaluation_options(shapes_root, ann_file, out_dir), env=cpu_env())
        predictions = pickle.load(open(osp.join(out_dir, 'predictions.pkl'), 'rb'))
        return ann_file, out_dir, copypaste_lines(log), predictions

    return run


def assert_same_evaluation(log, out_dir, single_process, num_images):
    ann_file, single_out_dir, numbers, predictions = single_process
    assert copypaste_lines(log) == numbers and numbers.keys() == {'bbox', 'segm'}
    # Every image once, in dataset order: the padding DefaultSampler adds to even out the processes is dropped
    gathered = pickle.load(open(osp.join(out_dir, 'predictions.pkl'), 'rb'))
    image_ids = list(range(1, num_images + 1))
    assert [p['img_id'] for p in gathered] == [p['img_id'] for p in predictions] == image_ids
    for ours, reference in zip(gathered, predictions):
        ours, reference = ours['pred_instances'], reference['pred_instances']
        for key in ('bboxes', 'scores', 'labels'):
            assert torch.equal(ours[key], reference[key]), key
        assert ours['masks'] == reference['masks']  # RLE, as DumpDetResults writes them
    # what CocoMetric evaluated, and the statistics themselves, not their 3 printed decimals
    for iou_type in ('bbox', 'segm'):
        assert json.load(open(osp.join(out_dir, f'coco.{iou_type}.json'))) == json.load(
            open(osp.join(single_out_dir, f'coco.{iou_type}.json'))), iou_type
    stats, single_stats = unrounded_coco_stats(ann_file, out_dir), unrounded_coco_stats(ann_file, single_out_dir)
    assert stats['bbox'][0] > 0  # the model finds objects: the numbers compared are not all 0
    for iou_type in ('bbox', 'segm'):
        assert np.array_equal(stats[iou_type], single_stats[iou_type]), iou_type
        assert float(numbers[iou_type].split()[0]) == pytest.approx(stats[iou_type][0], abs=6e-4)


@pytest.mark.slow
@pytest.mark.parametrize('num_images', [8, 7], ids=['8 images', '7 images (not divisible by 2)'])
def test_dist_test_reports_the_single_process_numbers(shapes_root, trained_checkpoint, single_process_test,
                                                      num_images, tmp_path):
    single_process = single_process_test(num_images)
    log = run_tool('dist_test.sh', DEMO, trained_checkpoint, '2', '--work-dir', str(tmp_path), '--out',
                   str(tmp_path / 'predictions.pkl'), '--cfg-options',
                   *evaluation_options(shapes_root, single_process[0], str(tmp_path)),
                   env=cpu_env(PORT=str(free_port())))
    assert 'Distributed launcher: pytorch' in log
    assert_same_evaluation(log, str(tmp_path), single_process, num_images)


@pytest.mark.slow
def test_slurm_scripts_train_and_test_with_two_tasks_on_cpu(shapes_root, trained_checkpoint,
                                                            single_process_test, tmp_path):
    env = cpu_env(PATH=FAKE_SLURM + os.pathsep + os.environ['PATH'],
                  FAKE_SRUN_ARGS=str(tmp_path / 'srun.json'), GPUS='2', GPUS_PER_NODE='2', CPUS_PER_TASK='1',
                  GRES='', SRUN_ARGS='--mem=0 --time=10', MASTER_PORT=str(free_port()))
    env.pop('MASTER_ADDR', None)  # taken from `scontrol show hostname`, as on a cluster

    work_dir = str(tmp_path / 'train')
    log = run_tool('slurm_train.sh', 'cpu', 'condtok', DEMO, work_dir, '--cfg-options',
                   *data_options(shapes_root, 1), 'train_dataloader.dataset.indices=8', env=env)
    assert 'Distributed launcher: slurm' in log and 'Distributed training: True' in log
    assert 'Epoch(train) [1][1/1]' in log and osp.exists(osp.join(work_dir, 'epoch_1.pth'))
    # no --gres with GRES='' (CPU nodes); SRUN_ARGS split into options
    assert json.load(open(tmp_path / 'srun.json')) == [
        '-p', 'cpu', '--job-name=condtok', '--ntasks=2', '--ntasks-per-node=2', '--cpus-per-task=1',
        '--kill-on-bad-exit=1', '--mem=0', '--time=10', sys.executable, '-u',
        osp.join(REPO_ROOT, 'tools', 'train.py'), DEMO,
        f'--work-dir={work_dir}', '--launcher=slurm', '--cfg-options', *data_options(shapes_root, 1),
        'train_dataloader.dataset.indices=8'
    ]

    single_process = single_process_test(8)
    env['MASTER_PORT'] = str(free_port())
    log = run_tool('slurm_test.sh', 'cpu', 'condtok', DEMO, trained_checkpoint, '--work-dir',
                   str(tmp_path / 'test'), '--out', str(tmp_path / 'predictions.pkl'), '--cfg-options',
                   *evaluation_options(shapes_root, single_process[0], str(tmp_path)), env=env)
    assert 'Distributed launcher: slurm' in log
    assert_same_evaluation(log, str(tmp_path), single_process, 8)
