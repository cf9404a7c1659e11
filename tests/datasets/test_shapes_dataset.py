import filecmp
import os.path as osp

import numpy as np
from PIL import Image
from pycocotools.coco import COCO
from pycocotools import mask as mask_utils

from condtok_mm.datasets import SHAPE_CLASSES, make_shapes_dataset


def test_writes_a_valid_coco_instance_dataset(shapes_root):
    for split, count in (('train', 16), ('val', 8)):
        coco = COCO(osp.join(shapes_root, 'annotations', f'instances_{split}.json'))
        assert [c['name'] for c in coco.loadCats(coco.getCatIds())] == list(SHAPE_CLASSES)
        assert len(coco.getImgIds()) == count
        per_image = [len(coco.getAnnIds(imgIds=i)) for i in coco.getImgIds()]
        assert min(per_image) >= 1 and max(per_image) <= 6
        for ann in coco.loadAnns(coco.getAnnIds()):
            info = coco.loadImgs(ann['image_id'])[0]
            image = Image.open(osp.join(shapes_root, split, info['file_name']))
            assert image.size == (info['width'], info['height']) and image.mode == 'RGB'
            mask = coco.annToMask(ann)
            assert mask.sum() == ann['area'] > 0
            ys, xs = np.nonzero(mask)
            x, y, w, h = ann['bbox']
            assert (xs.min(), ys.min(), xs.max() + 1, ys.max() + 1) == (x, y, x + w, y + h)


def test_overlapping_instances_are_annotated_by_their_visible_part(shapes_root):
    coco = COCO(osp.join(shapes_root, 'annotations', 'instances_train.json'))
    overlapping_boxes = 0
    for image_id in coco.getImgIds():
        anns = coco.loadAnns(coco.getAnnIds(imgIds=image_id))
        masks = [coco.annToMask(a).astype(bool) for a in anns]
        for i in range(len(masks)):
            for j in range(i + 1, len(masks)):
                assert not (masks[i] & masks[j]).any()  # visible parts never overlap
        rles = [mask_utils.encode(np.asfortranarray(m.astype(np.uint8))) for m in masks]
        boxes = mask_utils.toBbox(rles) if rles else []
        ious = mask_utils.iou(list(boxes), list(boxes), [0] * len(anns)) if len(anns) > 1 else np.zeros(1)
        overlapping_boxes += int((np.triu(ious, 1) > 0).sum())
    assert overlapping_boxes > 0


def test_same_seed_same_files(tmp_path, shapes_root):
    again = make_shapes_dataset(str(tmp_path), num_train=16, num_val=8, image_size=(96, 96), seed=3)
    assert filecmp.cmp(again['val'], osp.join(shapes_root, 'annotations', 'instances_val.json'),
                       shallow=False)
    assert filecmp.cmp(osp.join(tmp_path, 'train', '000005.png'),
                       osp.join(shapes_root, 'train', '000005.png'), shallow=False)
    make_shapes_dataset(str(tmp_path / 'other'), num_train=1, num_val=1, image_size=(96, 96), seed=4)
    assert not filecmp.cmp(osp.join(tmp_path, 'other', 'val', '000000.png'),
                           osp.join(shapes_root, 'val', '000000.png'), shallow=False)


def test_semantic_maps_paint_each_visible_instance_with_its_class(shapes_root):
    for split in ('train', 'val'):
        coco = COCO(osp.join(shapes_root, 'annotations', f'instances_{split}.json'))
        for info in coco.loadImgs(coco.getImgIds()):
            semantic = np.array(Image.open(osp.join(shapes_root, 'semantic', split, info['file_name'])))
            expected = np.zeros((info['height'], info['width']), np.uint8)  # 0: background
            for ann in coco.loadAnns(coco.getAnnIds(imgIds=info['id'])):
                expected[coco.annToMask(ann).astype(bool)] = ann['category_id']
            assert np.array_equal(semantic, expected), info['file_name']
