"""The NEON configs' training augmentation on one tile of the crop's size: the image comes out in one of the eight
symmetries of the square (all eight are drawn) and no box comes out narrower than a pixel, which would give a
NaN box-regression loss."""
import os.path as osp

import numpy as np
from mmengine.config import Config
from mmengine.dataset import Compose
from mmengine.registry import init_default_scope
from PIL import Image

from helpers.repo import REPO_ROOT

CONFIG = osp.join(REPO_ROOT, 'configs', 'neon', 'faster-rcnn_swin-mini_fpn_400e_neon-trees.py')
# the one-pixel edges of crowns cut by a tile or a crop, along each side, and one whole crown inside
BOXES = [[100, 0, 140, 1], [100, 191, 140, 192], [0, 100, 1, 140], [191, 100, 192, 140], [0, 0, 10, 10],
         [50, 50, 90, 80]]


def symmetries(image):
    """The eight images of the square's symmetry group applied to ``image``."""
    return [np.rot90(flipped, k) for flipped in (image, image[:, ::-1]) for k in range(4)]


def test_augmentation_draws_every_symmetry_of_the_tile_and_never_a_box_under_a_pixel(tmp_path):
    cfg = Config.fromfile(CONFIG)
    size = cfg.crop_size[0]
    image = np.random.default_rng(0).integers(0, 256, (size, size, 3), dtype=np.uint8)
    Image.fromarray(image).save(tmp_path / 'tile.png')
    init_default_scope('mmdet')
    pipeline = Compose(cfg.train_pipeline)
    drawn, degenerate = set(), 0
    for seed in range(64):
        np.random.seed(seed)
        out = pipeline(dict(img_path=str(tmp_path / 'tile.png'), img_id=0,
                            instances=[dict(bbox=box, bbox_label=0, ignore_flag=0) for box in BOXES]))
        pixels = out['inputs'].permute(1, 2, 0).numpy()[..., ::-1]  # CHW BGR back to HWC RGB
        matches = [i for i, candidate in enumerate(symmetries(image)) if np.array_equal(pixels, candidate)]
        assert len(matches) == 1, seed
        drawn.add(matches[0])
        boxes = out['data_samples'].gt_instances.bboxes.tensor.numpy()
        degenerate += int(((boxes[:, 2:] - boxes[:, :2]) < 1).any())
        sizes = sorted((boxes[:, 2:] - boxes[:, :2]).tolist())
        assert [30, 40] in sizes or [40, 30] in sizes, seed  # the inside box, turned or not
    assert drawn == set(range(8))
    assert degenerate == 0
