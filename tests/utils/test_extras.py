"""condtok_mm.utils.check_vis_backends: a config that logs to TensorBoard without tensorboard names the extra, and
the tools stop before building anything."""
import os
import os.path as osp
import subprocess
import sys

import pytest
from mmengine.config import Config
from mmengine.visualization import TensorboardVisBackend

from condtok_mm.utils import MissingExtraError, check_vis_backends
from helpers.repo import REPO_ROOT

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


@pytest.mark.slow
def test_train_stops_before_building_anything_when_the_config_needs_tensorboard(tmp_path):
    # tools/train.py in a process where tensorboard is not installed (a sitecustomize on its path blocks the import,
    # as None in sys.modules does); COCO is not here either: the missing extra is reported first, as the one thing
    # to install
    blocker = tmp_path / 'without_tensorboard'
    blocker.mkdir()
    (blocker / 'sitecustomize.py').write_text('import sys\nsys.modules["tensorboard"] = None\n')
    work_dir = tmp_path / 'work'
    work_dir.mkdir()
    result = subprocess.run(
        [sys.executable, osp.join(REPO_ROOT, 'tools', 'train.py'), COCO_CONFIG, '--work-dir', str(work_dir)],
        capture_output=True, text=True, timeout=300, cwd=str(tmp_path),
        env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(blocker), *filter(None, [os.environ.get('PYTHONPATH')])])))
    assert result.returncode == 1, result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-1].startswith('error: the config logs to TensorBoard')
    assert TENSORBOARD_HINT in result.stderr
    assert list(work_dir.iterdir()) == []
