"""mmsegmentation: the CPU-sized UPerNet demo trains a few iterations on the shapes data's semantic maps and
evaluates mIoU, through mmseg's own tools/train.py and the config's custom_imports alone."""
import os.path as osp
import re
import subprocess
import sys

import mmseg
import pytest

from helpers.repo import REPO_ROOT

SEG_DEMO = osp.join(REPO_ROOT, 'configs', 'demo', 'upernet_swin-mini-condtok_1xb4-200it_shapes-128x128.py')


@pytest.mark.slow
def test_segmentation_demo_trains_with_mmseg_tools_and_reports_miou(shapes_root, tmp_path):
    options = [f'{split}_dataloader.{key}' for split in ('train', 'val', 'test')
               for key in ('num_workers=0', 'persistent_workers=False')]
    options += [f'{split}_dataloader.dataset.data_root={shapes_root}/' for split in ('train', 'val', 'test')]
    result = subprocess.run(
        [sys.executable, osp.join(osp.dirname(mmseg.__file__), '.mim', 'tools', 'train.py'), SEG_DEMO,
         '--work-dir', str(tmp_path), '--cfg-options', *options, 'train_cfg.max_iters=4', 'train_cfg.val_interval=4',
         'default_hooks.logger.interval=1', 'default_hooks.checkpoint.interval=4'],
        capture_output=True, text=True, timeout=600, cwd=tmp_path)
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-3000:]
    assert re.search(r'kappa: stage0 tokens kappa \S+ -> 2 ', log)  # CondSwinTransformer conditioned
    for name in ('background', 'circle', 'square', 'triangle', 'star'):  # per-class IoU of the 5 classes
        assert re.search(rf'\|\s+{name}\s+\|\s+[\d.]+\s+\|', log), name
    miou = float(re.search(r'Iter\(val\) \[\d+/\d+\]\s+aAcc: [\d.]+\s+mIoU: ([\d.]+)', log).group(1))
    assert 0 < miou <= 100
    assert (tmp_path / 'iter_4.pth').is_file()
