"""A small deterministic COCO-format instance-segmentation dataset of shapes on textured backgrounds.

It stands in for COCO where COCO is not available (the demo and the tests): several shape classes, 1-6
instances per image that may overlap (each annotation is the *visible* part of its shape, as in COCO),
RLE instance masks, and textured backgrounds so that the task is not solved by a colour threshold.
The same ``seed`` always writes the same files.
"""
import json
import os
import os.path as osp
from typing import Dict, List, Tuple

import numpy as np
from PIL import Image, ImageDraw
from pycocotools import mask as mask_utils

SHAPE_CLASSES = ('circle', 'square', 'triangle', 'star')
SPLIT_SEEDS = {'train': 0, 'val': 1, 'test': 2}
# An instance is only placed if every earlier instance keeps at least this fraction of its area visible.
MIN_VISIBLE_FRACTION = 0.5
# The shortest image side that holds a shape: each is 8-22 % of the shorter side across and at least 40 pixels.
MIN_IMAGE_SIDE = 32


def _texture(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """A random background: a colour gradient, plus stripes or a checkerboard, plus smooth noise."""
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    base = rng.uniform(40, 200, size=3)
    slope = rng.uniform(-0.4, 0.4, size=(2, 3))
    img = base + yy[..., None] * slope[0] + xx[..., None] * slope[1]
    period = rng.uniform(6, 20)
    angle = rng.uniform(0, np.pi)
    phase = (xx * np.cos(angle) + yy * np.sin(angle)) / period
    if rng.random() < 0.5:
        pattern = np.sin(2 * np.pi * phase)
    else:
        pattern = np.sign(np.sin(2 * np.pi * xx / period) * np.sin(2 * np.pi * yy / period))
    img += pattern[..., None] * rng.uniform(8, 30, size=3)
    coarse = rng.normal(0, 20, size=(height // 16 + 2, width // 16 + 2, 3)).astype(np.float32)
    noise = np.asarray(Image.fromarray(coarse.astype(np.uint8)).resize((width, height), Image.BILINEAR),
                       dtype=np.float32)
    img += (noise - noise.mean()) * 0.5 + rng.normal(0, 4, size=(height, width, 3))
    return np.clip(img, 0, 255)


def _shape_polygon(kind: str, cx: float, cy: float, radius: float, angle: float) -> List[Tuple]:
    if kind == 'square':
        corners = [angle + np.pi / 4 + k * np.pi / 2 for k in range(4)]
        return [(cx + radius * np.cos(a), cy + radius * np.sin(a)) for a in corners]
    if kind == 'triangle':
        return [(cx + radius * np.cos(angle + k * 2 * np.pi / 3),
                 cy + radius * np.sin(angle + k * 2 * np.pi / 3)) for k in range(3)]
    if kind == 'star':
        points = []
        for k in range(10):
            r = radius if k % 2 == 0 else radius * 0.45
            a = angle + k * np.pi / 5
            points.append((cx + r * np.cos(a), cy + r * np.sin(a)))
        return points
    raise ValueError(f'unknown shape {kind!r}; valid shapes are {SHAPE_CLASSES}')


def _shape_mask(kind: str, cx: float, cy: float, radius: float, angle: float, height: int,
                width: int) -> np.ndarray:
    canvas = Image.new('L', (width, height), 0)
    draw = ImageDraw.Draw(canvas)
    if kind == 'circle':
        draw.ellipse([cx - radius, cy - radius, cx + radius, cy + radius], fill=1)
    else:
        draw.polygon(_shape_polygon(kind, cx, cy, radius, angle), fill=1)
    return np.asarray(canvas, dtype=bool)


def render_image(rng: np.random.Generator, height: int, width: int,
                 max_instances: int = 6) -> Tuple[np.ndarray, List[Dict]]:
    """One image (uint8 HxWx3) and its instances: dicts with 'category_id' (1-based) and 'mask'."""
    image = _texture(rng, height, width)
    num_instances = int(rng.integers(1, max_instances + 1))
    placed = []  # (label, full mask, colour), painted in this order
    for _ in range(num_instances * 10):
        if len(placed) == num_instances:
            break
        label = int(rng.integers(len(SHAPE_CLASSES)))
        radius = rng.uniform(0.08, 0.22) * min(height, width)
        cx, cy = rng.uniform(radius * 0.6, width - radius * 0.6), rng.uniform(radius * 0.6,
                                                                               height - radius * 0.6)
        mask = _shape_mask(SHAPE_CLASSES[label], cx, cy, radius, rng.uniform(0, 2 * np.pi), height,
                           width)
        if mask.sum() < 40:
            continue
        # Reject a placement that hides too much of an earlier instance (it would be unannotatable).
        if any((m & ~mask).sum() < MIN_VISIBLE_FRACTION * m.sum() for _, m, _ in placed):
            continue
        placed.append((label, mask, rng.uniform(0, 255, size=3)))

    for label, mask, colour in placed:  # bottom to top
        shade = 0.85 + 0.15 * rng.random((height, width, 1))
        image = np.where(mask[..., None], colour * shade, image)
    instances = []
    occluders = np.zeros((height, width), dtype=bool)
    for label, mask, _ in reversed(placed):  # top to bottom: what lies above hides what lies below
        instances.append(dict(category_id=label + 1, mask=mask & ~occluders))
        occluders |= mask
    return image.astype(np.uint8), instances[::-1]


def _annotation(mask: np.ndarray, ann_id: int, image_id: int, category_id: int) -> Dict:
    rle = mask_utils.encode(np.asfortranarray(mask.astype(np.uint8)))
    x, y, w, h = mask_utils.toBbox(rle).tolist()
    rle['counts'] = rle['counts'].decode('ascii')
    return dict(id=ann_id, image_id=image_id, category_id=category_id, segmentation=rle,
                area=float(mask.sum()), bbox=[x, y, w, h], iscrowd=0)


def make_shapes_dataset(root: str, num_train: int = 200, num_val: int = 50,
                        image_size: Tuple[int, int] = (128, 128), seed: int = 0, num_test: int = 0) -> Dict[str, str]:
    """Write ``root/{train,val}/*.png``, ``root/annotations/instances_{train,val}.json`` and the semantic label
    maps ``root/semantic/{train,val}/*.png`` (for mmseg; 0 is the background, i the i-th class), and the same for a
    ``test`` split where ``num_test`` > 0.

    Args:
        root (str): output folder (created).
        num_train (int): number of training images. Default: 200.
        num_val (int): number of validation images. Default: 50.
        image_size (tuple[int, int]): (height, width). Default: (128, 128).
        seed (int): base seed; split s uses ``seed * 1000 + SPLIT_SEEDS[s]``, so each split is drawn from its own
            stream: adding a test split changes no image of the others. Default: 0.
        num_test (int): number of held-out test images (none written for 0). Default: 0.

    Returns:
        dict: split name -> annotation file path.
    """
    height, width = image_size
    if min(num_train, num_val, num_test) < 0 or min(height, width) < MIN_IMAGE_SIDE:
        raise ValueError(f'make_shapes_dataset: num_train={num_train}, num_val={num_val}, num_test={num_test}, '
                         f'image_size={image_size}: counts cannot be negative, and each side needs at least '
                         f'{MIN_IMAGE_SIDE} pixels to hold a shape')
    categories = [dict(id=i + 1, name=name, supercategory='shape') for i, name in enumerate(SHAPE_CLASSES)]
    os.makedirs(osp.join(root, 'annotations'), exist_ok=True)
    ann_files = {}
    splits = [('train', num_train), ('val', num_val)] + ([('test', num_test)] if num_test else [])
    for split, count in splits:
        rng = np.random.default_rng(seed * 1000 + SPLIT_SEEDS[split])
        os.makedirs(osp.join(root, split), exist_ok=True)
        os.makedirs(osp.join(root, 'semantic', split), exist_ok=True)
        images, annotations = [], []
        for index in range(count):
            image, instances = render_image(rng, height, width)
            file_name = f'{index:06d}.png'
            Image.fromarray(image).save(osp.join(root, split, file_name))
            image_id = index + 1
            images.append(dict(id=image_id, file_name=file_name, height=height, width=width))
            semantic = np.zeros((height, width), np.uint8)  # 0: background, i: SHAPE_CLASSES[i - 1]
            for inst in instances:  # disjoint masks: each already excludes the shapes drawn over it
                annotations.append(_annotation(inst['mask'], len(annotations) + 1, image_id,
                                               inst['category_id']))
                semantic[inst['mask']] = inst['category_id']
            Image.fromarray(semantic).save(osp.join(root, 'semantic', split, file_name))
        # training on a split without annotations fails deep in mmdet ("need at least one array to concatenate")
        if count and not annotations:
            raise ValueError(f'make_shapes_dataset: none of the {count} {split} images of {height}x{width} holds a '
                             'shape; make more or larger images')
        ann_file = osp.join(root, 'annotations', f'instances_{split}.json')
        with open(ann_file + '.tmp', 'w') as f:
            json.dump(dict(images=images, annotations=annotations, categories=categories), f)
        os.replace(ann_file + '.tmp', ann_file)  # the annotation file appears only when complete
        ann_files[split] = ann_file
    return ann_files
