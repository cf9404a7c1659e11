"""condtok_mm.utils.check_vis_backends: a config that logs to TensorBoard without tensorboard names the extra, and
the tools stop before building anything."""
import os.path as osp
import sys

import pytest
from mmengine.config import Config
from mmengine.visualization import TensorboardVisBackend

from condtok_mm.utils import MissingExtraError, check_vis_backends
from helpers.repo import REPO_ROOT, load_script

COCO_CONFIG = osp.join(REPO_ROOT, 'configs', 'swin', 'mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py')

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
