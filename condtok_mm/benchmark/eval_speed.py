"""Time COCO evaluation: FastCocoMetric (faster-coco-eval) against mmdet's CocoMetric (pycocotools), and
FastCocoMetric in 1 vs 2 processes.

    python tools/benchmark/eval_speed.py [--num-images 5000] [--processes 1 2]
                                         [--out-dir work_dirs/benchmark/eval_speed]

The evaluation set is COCO-sized and synthetic, generated deterministically from --seed: --num-images
images of COCO's sizes, 80 classes, on average 7.3 objects per image with polygon masks (COCO val2017: 36,781
objects in 5,000 images), spread over COCO's small/medium/large areas; and --dets-per-image predictions per
image (100, mmdet's max_per_img) with RLE masks: each object found with probability 0.8 (jittered box and
polygon, the right class 90% of the time), the rest false positives. Both metrics get the same
predictions; the time of ``metric.evaluate()`` (what a val/test epoch spends after inference: result
conversion, COCO matching, accumulation, summary) is measured once for bbox and once for segm.

With more than one process (--processes, gloo on 127.0.0.1, as tools/dist_test.sh runs without a GPU),
each rank holds the predictions of its share of the images, as mmengine's DefaultSampler deals them out,
and ``evaluate()`` is what a distributed test spends after inference: gathering every rank's results on
rank 0 (mmengine's collect_results), the COCO evaluation there, and broadcasting the metrics. The metrics
must equal the 1-process ones; the table gives rank 0's time.

Prints a table, writes eval_speed.json and eval_speed.png to --out-dir, and says what machine it ran on.
"""
import argparse
import json
import multiprocessing
import os
import os.path as osp
import socket
import sys
import tempfile
import time

import numpy as np
import torch
from pycocotools import mask as mask_utils
from tqdm import tqdm

from condtok_mm.evaluation import FastCocoMetric
from condtok_mm.utils import describe_machine
from mmdet.evaluation.metrics import CocoMetric

NUM_CLASSES = 80
IMAGE_SIZES = ((640, 480), (480, 640), (640, 427), (640, 426), (500, 375), (640, 640), (427, 640))  # (w, h)
MEAN_OBJECTS_PER_IMAGE = 7.3


def parse_args():
    parser = argparse.ArgumentParser(description='Time FastCocoMetric against CocoMetric')
    parser.add_argument('--num-images', type=int, default=5000, help='images (COCO val2017 has 5000)')
    parser.add_argument('--dets-per-image', type=int, default=100, help='predictions per image')
    parser.add_argument('--seed', type=int, default=0, help='seed of the synthetic set')
    parser.add_argument('--processes', type=int, nargs='+', default=[1, 2],
                        help='process counts to time FastCocoMetric with (1 is always timed)')
    parser.add_argument('--out-dir', default='work_dirs/benchmark/eval_speed', help='where to write results')
    args = parser.parse_args()
    if args.num_images < 1 or args.dets_per_image < 1:
        parser.error('--num-images and --dets-per-image must be positive')
    if min(args.processes) < 1:
        parser.error('--processes must be positive')
    return args


def polygon_in_box(rng, x, y, w, h, jitter=0.0):
    """A star-convex polygon (flat [x1, y1, x2, y2, ...]) filling most of the box, its vertices moved by
    jitter times the box size."""
    count = int(rng.integers(8, 20))
    angles = np.sort(rng.uniform(0, 2 * np.pi, size=count))
    radii = rng.uniform(0.7, 1.0, size=count)
    xs = x + w / 2 + radii * np.cos(angles) * w / 2 + rng.normal(0, jitter * w, size=count)
    ys = y + h / 2 + radii * np.sin(angles) * h / 2 + rng.normal(0, jitter * h, size=count)
    return np.stack([xs, ys], axis=1).ravel().tolist()


def random_box(rng, width, height):
    # sqrt(area) log-uniform over 8..400 px: about COCO's mix of small, medium and large objects
    side = np.exp(rng.uniform(np.log(8), np.log(400)))
    aspect = np.exp(rng.uniform(np.log(0.5), np.log(2)))
    w, h = min(side * np.sqrt(aspect), width - 1), min(side / np.sqrt(aspect), height - 1)
    return rng.uniform(0, width - w), rng.uniform(0, height - h), w, h


def rle_of(polygon, width, height):
    return mask_utils.merge(mask_utils.frPyObjects([polygon], height, width))


def make_evaluation_set(num_images, dets_per_image, seed):
    """(COCO ground-truth dict, mmdet data samples with predictions), the same for the same arguments."""
    rng = np.random.default_rng(seed)
    images, annotations, samples = [], [], []
    for image_id in tqdm(range(1, num_images + 1), desc='generating images and predictions', unit='img'):
        width, height = IMAGE_SIZES[int(rng.integers(len(IMAGE_SIZES)))]
        images.append(dict(id=image_id, width=width, height=height, file_name=f'{image_id:012d}.jpg'))
        boxes, labels, scores, masks = [], [], [], []
        for _ in range(max(1, int(rng.poisson(MEAN_OBJECTS_PER_IMAGE)))):
            x, y, w, h = random_box(rng, width, height)
            category_id = int(rng.integers(1, NUM_CLASSES + 1))
            polygon = polygon_in_box(rng, x, y, w, h)
            rle = rle_of(polygon, width, height)
            annotations.append(
                dict(id=len(annotations) + 1, image_id=image_id, category_id=category_id,
                     segmentation=[polygon], area=float(mask_utils.area(rle)),
                     bbox=mask_utils.toBbox(rle).tolist(), iscrowd=0))
            if rng.random() < 0.8 and len(boxes) < dets_per_image:
                jitter = rng.normal(0, 0.05, size=4) * [w, h, w, h]
                px, py, pw, ph = x + jitter[0], y + jitter[1], max(w + jitter[2], 1), max(h + jitter[3], 1)
                boxes.append([px, py, px + pw, py + ph])
                labels.append(category_id - 1 if rng.random() < 0.9 else int(rng.integers(NUM_CLASSES)))
                scores.append(rng.uniform(0.3, 1.0))
                masks.append(rle_of(polygon_in_box(rng, px, py, pw, ph, jitter=0.03), width, height))
        while len(boxes) < dets_per_image:  # false positives, mostly with low scores
            x, y, w, h = random_box(rng, width, height)
            boxes.append([x, y, x + w, y + h])
            labels.append(int(rng.integers(NUM_CLASSES)))
            scores.append(rng.uniform(0.05, 0.6))
            masks.append(rle_of(polygon_in_box(rng, x, y, w, h), width, height))
        samples.append(
            dict(img_id=image_id, ori_shape=(height, width),
                 pred_instances=dict(bboxes=torch.tensor(boxes, dtype=torch.float32),
                                     scores=torch.tensor(scores, dtype=torch.float32),
                                     labels=torch.tensor(labels, dtype=torch.int64), masks=masks)))
    categories = [dict(id=i, name=f'class_{i}', supercategory='object') for i in range(1, NUM_CLASSES + 1)]
    return dict(images=images, annotations=annotations, categories=categories), samples


def processed_metric(metric_class, ann_file, task, samples):
    """A freshly built metric that has processed ``samples`` for one task, ready for ``evaluate()``."""
    metric = metric_class(ann_file=ann_file, metric=task)
    metric.dataset_meta = dict(classes=tuple(f'class_{i}' for i in range(1, NUM_CLASSES + 1)))
    if task == 'bbox':  # without masks, as a box-only detector's results: no segm results are written
        samples = [dict(s, pred_instances={k: v for k, v in s['pred_instances'].items() if k != 'masks'})
                   for s in samples]
    metric.process({}, samples)
    return metric


def time_evaluation(metric_class, ann_file, task, samples):
    """Seconds that ``evaluate()`` of a freshly built metric takes for one task, and its results."""
    metric = processed_metric(metric_class, ann_file, task, samples)
    start = time.perf_counter()
    results = metric.evaluate(len(samples))
    return time.perf_counter() - start, results


def distributed_rank(rank, world_size, port, ann_file, samples, queue):
    """One rank of a distributed FastCocoMetric evaluation; rank 0 reports (task, seconds, results)."""
    import torch.distributed as dist
    os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port))
    dist.init_process_group('gloo', rank=rank, world_size=world_size)
    try:
        for task in ('bbox', 'segm'):
            # DefaultSampler(shuffle=False) gives rank r the images r, r + world_size, ...
            metric = processed_metric(FastCocoMetric, ann_file, task, samples[rank::world_size])
            dist.barrier()
            start = time.perf_counter()
            results = metric.evaluate(len(samples))
            if rank == 0:
                queue.put((task, time.perf_counter() - start, results))
    finally:
        dist.destroy_process_group()


def time_distributed_evaluation(world_size, ann_file, samples):
    """{task: (rank 0's evaluate() seconds, results)} of FastCocoMetric over ``world_size`` processes."""
    with socket.socket() as sock:  # a free port, chosen by the OS
        sock.bind(('127.0.0.1', 0))
        port = sock.getsockname()[1]
    context = multiprocessing.get_context('spawn')
    queue = context.SimpleQueue()
    ranks = [context.Process(target=distributed_rank, args=(rank, world_size, port, ann_file, samples, queue))
             for rank in range(world_size)]
    for process in ranks:
        process.start()
    for process in ranks:
        process.join()
    failed = [rank for rank, process in enumerate(ranks) if process.exitcode != 0]
    if failed:
        raise RuntimeError(f'distributed evaluation with {world_size} processes failed on ranks {failed}')
    measured = {}
    while not queue.empty():
        task, seconds, results = queue.get()
        measured[task] = (seconds, results)
    return measured


def plot(rows, machine, path):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    tasks = [row['task'] for row in rows]
    positions = np.arange(len(tasks))
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    ax.bar(positions - 0.2, [row['CocoMetric_s'] for row in rows], 0.4, label='CocoMetric (pycocotools)')
    ax.bar(positions + 0.2, [row['FastCocoMetric_s'] for row in rows], 0.4,
           label='FastCocoMetric (faster-coco-eval)')
    for position, row in zip(positions, rows):
        ax.annotate(f'{row["speedup"]:.1f}x faster', (position + 0.2, row['FastCocoMetric_s']),
                    ha='center', va='bottom', fontsize=9)
    ax.set_xticks(positions, tasks)
    ax.set_ylabel('evaluate() time (s)')
    ax.set_title(f'COCO evaluation of {rows[0]["num_images"]} images, {rows[0]["num_predictions"]} '
                 f'predictions\n{machine["cpu"]}, {machine["usable_cpus"]} CPUs', fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    args = parse_args()
    machine = describe_machine(packages=('numpy', 'mmdet', 'mmengine', 'pycocotools', 'faster-coco-eval'))
    print(f'machine: {machine["cpu"]} ({machine["usable_cpus"]} usable CPUs of {machine["cpu_count"]}), '
          f'{machine["platform"]}, load average {machine["load_average"]}')
    coco, samples = make_evaluation_set(args.num_images, args.dets_per_image, args.seed)
    os.makedirs(args.out_dir, exist_ok=True)
    rows, metric_differences = [], {}
    with tempfile.TemporaryDirectory() as tmp_dir:
        ann_file = osp.join(tmp_dir, 'instances_synthetic.json')
        with open(ann_file, 'w') as f:
            json.dump(coco, f)
        runs = [(task, metric_class) for task in ('bbox', 'segm')
                for metric_class in (CocoMetric, FastCocoMetric)]
        seconds, results = {}, {}
        for task, metric_class in tqdm(runs, desc='timing evaluate()', unit='run'):
            seconds[task, metric_class.__name__], results[task, metric_class.__name__] = time_evaluation(
                metric_class, ann_file, task, samples)
        distributed = {}
        for world_size in tqdm(sorted(set(args.processes) - {1}), desc='timing distributed evaluate()',
                               unit='run'):
            distributed[world_size] = time_distributed_evaluation(world_size, ann_file, samples)
    for task in ('bbox', 'segm'):
        reference, fast = results[task, 'CocoMetric'], results[task, 'FastCocoMetric']
        metric_differences[task] = max(abs(fast[key] - reference[key]) for key in reference)
        rows.append(dict(task=task, num_images=args.num_images,
                         num_predictions=args.num_images * args.dets_per_image,
                         CocoMetric_s=seconds[task, 'CocoMetric'],
                         FastCocoMetric_s=seconds[task, 'FastCocoMetric'],
                         speedup=seconds[task, 'CocoMetric'] / seconds[task, 'FastCocoMetric'],
                         mAP=reference[f'coco/{task}_mAP'], max_metric_difference=metric_differences[task]))
    process_rows = []
    for world_size, measured in distributed.items():
        for task, (task_seconds, task_results) in measured.items():
            single = results[task, 'FastCocoMetric']
            process_rows.append(dict(
                task=task, processes=world_size, seconds=task_seconds,
                single_process_s=seconds[task, 'FastCocoMetric'],
                max_metric_difference_to_single=max(abs(task_results[k] - single[k]) for k in single)))
    total_reference = sum(row['CocoMetric_s'] for row in rows)
    total_fast = sum(row['FastCocoMetric_s'] for row in rows)
    machine['load_average_at_end'] = os.getloadavg() if hasattr(os, 'getloadavg') else None

    print(f'\nCOCO evaluate() time, {args.num_images} images x {args.dets_per_image} predictions, '
          f'{len(coco["annotations"])} objects, {NUM_CLASSES} classes:')
    print(f'{"task":<12} {"CocoMetric":>11} {"FastCocoMetric":>15} {"speed-up":>9} {"mAP":>6} '
          f'{"max |diff|":>11}')
    for row in rows:
        print(f'{row["task"]:<12} {row["CocoMetric_s"]:10.1f}s {row["FastCocoMetric_s"]:14.1f}s '
              f'{row["speedup"]:8.2f}x {row["mAP"]:6.3f} {row["max_metric_difference"]:11.1e}')
    print(f'{"bbox + segm":<12} {total_reference:10.1f}s {total_fast:14.1f}s '
          f'{total_reference / total_fast:8.2f}x')
    if process_rows:
        print('\nFastCocoMetric evaluate() in a distributed test (gather on rank 0 + evaluation):')
        print(f'{"task":<6} {"processes":>9} {"time":>8} {"1 process":>10} {"max |diff| to 1 process":>25}')
        for row in process_rows:
            print(f'{row["task"]:<6} {row["processes"]:>9} {row["seconds"]:7.1f}s '
                  f'{row["single_process_s"]:9.1f}s {row["max_metric_difference_to_single"]:25.1e}')
    print(f'machine: {machine["cpu"]}, {machine["usable_cpus"]} usable CPUs; load average at start '
          f'{machine["load_average"]}, at end {machine["load_average_at_end"]}')

    summary = dict(command=' '.join(sys.argv), num_images=args.num_images, dets_per_image=args.dets_per_image,
                   num_objects=len(coco['annotations']), num_classes=NUM_CLASSES, seed=args.seed, rows=rows,
                   processes=process_rows,
                   total=dict(CocoMetric_s=total_reference, FastCocoMetric_s=total_fast,
                              speedup=total_reference / total_fast), machine=machine)
    json_path, png_path = osp.join(args.out_dir, 'eval_speed.json'), osp.join(args.out_dir, 'eval_speed.png')
    with open(json_path, 'w') as f:
        json.dump(summary, f, indent=2)
    plot(rows, machine, png_path)
    print(f'wrote {json_path} and {png_path}')


if __name__ == '__main__':
    main()
