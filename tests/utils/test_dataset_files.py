"""condtok_mm.utils.check_dataset_files: a missing dataset says how to make the demo's data or get COCO."""
import os.path as osp

import pytest
from mmengine.config import Config

from condtok_mm.utils import DatasetNotFoundError, check_dataset_files
from helpers.repo import DEMO, REPO_ROOT

COCO_CONFIG = osp.join(REPO_ROOT, 'configs', 'swin', 'mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py')

def config_with_data_root(config, data_root):
    cfg = Config.fromfile(config)
    cfg.merge_from_dict({f'{split}_dataloader.dataset.data_root': data_root for split in ('train', 'val', 'test')})
    return cfg


def test_a_missing_demo_dataset_says_how_to_make_it_wherever_data_root_points(tmp_path):
    # a shapes config pointed at another folder (tmp_path: neither "shapes" nor "coco" in it)
    data_root = f"{tmp_path}/elsewhere/"
    with pytest.raises(DatasetNotFoundError) as error:
        check_dataset_files(config_with_data_root(DEMO, data_root))
    assert str(error.value) == (
        f'The synthetic shapes dataset is missing: {data_root}annotations/instances_train.json does not exist '
        f"(train_dataloader.dataset: CocoDataset, data_root='{data_root}').\n"
        f'Create it with `python tools/dataset/make_shapes.py --out-dir {data_root}` (or run `make demo`, which '
        'creates data/shapes/).')


def test_a_missing_coco_says_how_to_get_coco_even_where_its_path_has_shapes_in_it(tmp_path):
    data_root = f'{tmp_path}/shapes_of_coco/'
    with pytest.raises(DatasetNotFoundError) as error:
        check_dataset_files(config_with_data_root(COCO_CONFIG, data_root), splits=('val', ))
    message = str(error.value)
    assert message.startswith(f'COCO not found: {data_root}annotations/instances_val2017.json does not exist '
                              f"(val_dataloader.dataset: CocoDataset, data_root='{data_root}').\nThis config "
                              'trains and evaluates on COCO 2017. Download it from https://cocodataset.org and '
                              f'place it at {data_root} with annotations/instances_train2017.json, ')
    assert 'make_shapes.py' not in message
