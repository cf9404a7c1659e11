"""The shapes data as an image-classification task: each image labelled by the class of its largest instance.

It is the pretraining task of the protocol study (pretrain the demo backbone with and without conditioning in
mmpretrain, then fine-tune it as the detector's backbone). Write its images with their own seed, so that they
are not the detection data's: ``python tools/dataset/make_shapes.py --out-dir data/shapes_cls/ --seed 1
--num-train 10000 --num-val 500`` (the detection data uses seed 0).
"""
import json
import os.path as osp
from typing import List

from mmengine.dataset import BaseDataset
from mmengine.registry import DATASETS

from condtok_mm.datasets.shapes import SHAPE_CLASSES


def largest_instance_labels(coco: dict, classes=SHAPE_CLASSES) -> List[dict]:
    """[{'file_name', 'gt_label'}] for the images of a COCO-format dict, in its ``images`` order.

    The label is the index in ``classes`` of the category of the image's annotation with the largest
    ``area`` (the visible pixels of the shape, since shapes drawn over it are cut from its mask); ties go to
    the annotation listed first. Images without annotations are left out (they have no class).
    """
    names = {category['id']: category['name'] for category in coco['categories']}
    unknown = sorted(set(names.values()) - set(classes))
    if unknown:
        raise ValueError(f'ShapesClassificationDataset: categories {unknown} are not in the classes '
                         f'{tuple(classes)}; set metainfo=dict(classes=...) to the categories of the annotations')
    largest = {}
    for annotation in coco['annotations']:
        best = largest.get(annotation['image_id'])
        if best is None or annotation['area'] > best['area']:
            largest[annotation['image_id']] = annotation
    return [dict(file_name=image['file_name'], gt_label=list(classes).index(names[largest[image['id']]['category_id']]))
            for image in coco['images'] if image['id'] in largest]


@DATASETS.register_module()
class ShapesClassificationDataset(BaseDataset):
    """The shapes dataset (:mod:`condtok_mm.datasets.shapes`) read as classification: one sample per image,
    labelled with the class of its largest instance (:func:`largest_instance_labels`).

    Samples are ``dict(img_path=..., gt_label=int)``, what mmpretrain's pipelines (``LoadImageFromFile``,
    ``PackInputs``) and metrics (``Accuracy``) read, so mmpretrain configs use it as they use
    ``CustomDataset``. It is registered in mmengine's root registry, which mmpretrain's is a child of, and
    imports nothing from mmpretrain.

    Args:
        ann_file (str): the COCO-format annotations written by ``tools/dataset/make_shapes.py``, e.g.
            ``annotations/instances_train.json`` (relative to ``data_root``).
        data_prefix (dict): ``dict(img_path=FOLDER)``, the folder of the split's images, e.g. ``'train/'``.
        **kwargs: the other arguments of mmengine's ``BaseDataset`` (``data_root``, ``pipeline``,
            ``test_mode``, ``metainfo``, ...).
    """

    METAINFO = dict(classes=SHAPE_CLASSES)

    def __init__(self, ann_file: str, data_prefix: dict = dict(img_path=''), **kwargs):
        super().__init__(ann_file=ann_file, data_prefix=data_prefix, **kwargs)

    def load_data_list(self) -> List[dict]:
        if not osp.isfile(self.ann_file):
            raise FileNotFoundError(f'ShapesClassificationDataset: no annotation file {self.ann_file}; write the '
                                    'data with python tools/dataset/make_shapes.py --out-dir DATA_ROOT')
        with open(self.ann_file) as f:
            coco = json.load(f)
        folder = self.data_prefix.get('img_path', '')
        return [dict(img_path=osp.join(folder, sample['file_name']), gt_label=sample['gt_label'])
                for sample in largest_instance_labels(coco, self.metainfo['classes'])]
