"""ShapesClassificationDataset: every image labelled by its largest instance, checked against the decoded masks;
ties, images without instances and unknown categories; built and packed by mmpretrain."""
import json

import pytest
from pycocotools import mask as mask_utils

import condtok_mm  # noqa: F401
from condtok_mm.datasets import SHAPE_CLASSES, ShapesClassificationDataset, largest_instance_labels


def test_each_image_is_labelled_with_the_class_of_its_largest_visible_instance(shapes_root):
    dataset = ShapesClassificationDataset(ann_file='annotations/instances_train.json', data_root=shapes_root,
                                          data_prefix=dict(img_path='train/'))
    with open(f'{shapes_root}/annotations/instances_train.json') as f:
        coco = json.load(f)
    expected = []
    for image in coco['images']:  # from the masks themselves, not from the 'area' field the dataset reads
        pixels = {a['id']: (int(mask_utils.decode(a['segmentation']).sum()), a['category_id'])
                  for a in coco['annotations'] if a['image_id'] == image['id']}
        if pixels:
            area, category = max(pixels.values(), key=lambda v: v[0])
            expected.append((f'{shapes_root}/train/{image["file_name"]}', category - 1))
    assert len(dataset) == len(expected) == 16
    assert [(dataset[i]['img_path'], dataset[i]['gt_label']) for i in range(len(dataset))] == expected
    assert dataset.metainfo['classes'] == SHAPE_CLASSES
    assert len({label for _, label in expected}) > 1  # not one class for all (the data of seed 3)


def test_ties_go_to_the_first_annotation_and_images_without_instances_are_left_out():
    categories = [dict(id=i + 1, name=name) for i, name in enumerate(SHAPE_CLASSES)]
    coco = dict(categories=categories,
                images=[dict(id=1, file_name='a.png'), dict(id=2, file_name='b.png'), dict(id=3, file_name='c.png')],
                annotations=[dict(id=1, image_id=1, category_id=3, area=50.0),
                             dict(id=2, image_id=1, category_id=2, area=50.0),
                             dict(id=3, image_id=3, category_id=1, area=10.0),
                             dict(id=4, image_id=3, category_id=4, area=11.0)])
    assert largest_instance_labels(coco) == [dict(file_name='a.png', gt_label=2), dict(file_name='c.png', gt_label=3)]
    coco['categories'].append(dict(id=5, name='hexagon'))
    with pytest.raises(ValueError, match=r"categories \['hexagon'\] are not in the classes"):
        largest_instance_labels(coco)


def test_mmpretrain_builds_it_and_packs_its_samples(shapes_root, tmp_path):
    from mmengine.registry import DefaultScope
    from mmpretrain.registry import DATASETS
    from mmpretrain.utils import register_all_modules
    register_all_modules(init_default_scope=False)
    with DefaultScope.overwrite_default_scope('mmpretrain'):  # as the Runner of an mmpretrain config sets it
        dataset = DATASETS.build(dict(
            type='ShapesClassificationDataset', data_root=shapes_root, ann_file='annotations/instances_val.json',
            data_prefix=dict(img_path='val/'),
            pipeline=[dict(type='LoadImageFromFile'), dict(type='PackInputs')]))
        sample = dataset[0]
    assert tuple(sample['inputs'].shape) == (3, 96, 96)
    assert sample['data_samples'].gt_label.tolist() == [dataset.get_data_info(0)['gt_label']]
    with pytest.raises(FileNotFoundError, match='tools/dataset/make_shapes.py'):
        ShapesClassificationDataset(ann_file=str(tmp_path / 'none.json'))
