"""condtok_mm.utils.runtime: what the tools do to a config before they build the Runner."""
import logging
import os.path as osp
import uuid

import sys

import pytest
import torch
from mmengine.config import Config
from mmengine.logging import MMLogger
from mmengine.visualization import TensorboardVisBackend

from condtok_mm.utils import check_dataset_files, check_vis_backends, fall_back_from_amp_on_cpu
from condtok_mm.utils.runtime import DatasetNotFoundError, MissingExtraError
from conftest import DEMO, REPO_ROOT, load_script

COCO_CONFIG = osp.join(REPO_ROOT, 'configs', 'swin', 'mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py')

AMP_WARNING = 'AMP needs a GPU and none is available: training in float32 with OptimWrapper instead.'


def amp_config():
    return Config(dict(optim_wrapper=dict(type='AmpOptimWrapper', loss_scale='dynamic', dtype='bfloat16',
                                          optimizer=dict(type='AdamW', lr=1e-4), clip_grad=None)))


@pytest.fixture
def warnings_logged():
    """The WARNING messages of the current MMLogger (where the tools' print_log(logger='current') goes)."""
    logger = MMLogger.get_instance(f'runtime_{uuid.uuid4().hex}')  # the newest instance is the current one
    messages = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: messages.append(record.getMessage())
    logger.addHandler(handler)
    yield messages
    logger.removeHandler(handler)


def test_amp_config_without_gpu_trains_in_float32_with_a_warning(monkeypatch, warnings_logged):
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    cfg = amp_config()
    fall_back_from_amp_on_cpu(cfg)
    assert cfg.optim_wrapper == dict(type='OptimWrapper', optimizer=dict(type='AdamW', lr=1e-4), clip_grad=None)
    assert warnings_logged == [AMP_WARNING]


def test_amp_config_with_a_gpu_is_left_alone(monkeypatch, warnings_logged):
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    cfg = amp_config()
    fall_back_from_amp_on_cpu(cfg)
    assert cfg.optim_wrapper == amp_config().optim_wrapper
    assert warnings_logged == []


def test_a_float32_config_is_left_alone_without_gpu(monkeypatch, warnings_logged):
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    cfg = Config(dict(optim_wrapper=dict(type='OptimWrapper', optimizer=dict(type='SGD', lr=0.1))))
    fall_back_from_amp_on_cpu(cfg)
    assert cfg.optim_wrapper == dict(type='OptimWrapper', optimizer=dict(type='SGD', lr=0.1))
    assert warnings_logged == []


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


TENSORBOARD_HINT = 'pip install condtok_mm[tensorboard]'


@pytest.fixture
def without_tensorboard(monkeypatch):
    """tensorboard as if not installed: None in sys.modules is what the import system reads as 'not found'."""
    monkeypatch.setitem(sys.modules, 'tensorboard', None)


@pytest.mark.parametrize('backend', ['TensorboardVisBackend', 'mmengine.TensorboardVisBackend',
                                     TensorboardVisBackend])
def test_a_tensorboard_config_without_tensorboard_names_the_extra(without_tensorboard, backend):
    cfg = Config(dict(visualizer=dict(vis_backends=[dict(type='LocalVisBackend'), dict(type=backend)])))
    with pytest.raises(MissingExtraError, match=r'TensorBoard .* pip install condtok_mm\[tensorboard\]$'):
        check_vis_backends(cfg)


def test_a_config_without_tensorboard_logging_runs_without_tensorboard(without_tensorboard):
    check_vis_backends(Config(dict(visualizer=dict(vis_backends=[dict(type='LocalVisBackend')]))))
    check_vis_backends(Config(dict()))


def test_a_tensorboard_config_passes_where_tensorboard_is_installed():
    check_vis_backends(Config.fromfile(COCO_CONFIG))


def test_train_stops_before_building_anything_when_the_config_needs_tensorboard(without_tensorboard, monkeypatch,
                                                                                tmp_path):
    # COCO is not here either: the missing extra is reported first, as the one thing to install
    train = load_script('train.py')
    monkeypatch.setattr(sys, 'argv', ['train.py', COCO_CONFIG, '--work-dir', str(tmp_path)])
    with pytest.raises(SystemExit) as stop:
        train.main()
    assert str(stop.value.code).startswith('error: the config logs to TensorBoard') and TENSORBOARD_HINT in str(
        stop.value.code)
    assert list(tmp_path.iterdir()) == []
