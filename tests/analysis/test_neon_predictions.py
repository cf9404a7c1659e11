"""tools/analysis/neon_predictions.py: tiles' boxes moved into the photograph and merged across overlapping tiles,
the photograph pasted back from its tiles, the matching at IoU 0.5, the errors, and one run of a randomly
initialised NEON detector on a fake two-tile split."""
import json
import os
import os.path as osp

import numpy as np
import pytest
import torch
from PIL import Image

from condtok_mm.analysis import neon_predictions
from condtok_mm.compat.checkpoint_loading import UnsafeCheckpointError
from condtok_mm.datasets.neon_trees import tile_origins
from helpers.repo import REPO_ROOT, run_main

CONFIG = osp.join(REPO_ROOT, 'configs', 'neon', 'faster-rcnn_swin-mini_fpn_400e_neon-trees.py')
SCRIPT = osp.join(REPO_ROOT, 'tools', 'analysis', 'neon_predictions.py')
# the test photograph's top row of tiles: three abutting, the last moved back to end at the edge (x 849-1200 shared)
ROW = [(0, 0, 400, 400), (400, 0, 800, 400), (800, 0, 1200, 400), (849, 0, 1249, 400)]


def test_tile_boxes_move_into_the_photograph_by_their_window():
    boxes = np.array([[0, 0, 10, 20], [390.5, 12, 400, 399]])
    placed = neon_predictions.to_photograph(boxes, (849, 635, 1249, 1035))
    np.testing.assert_array_equal(placed, boxes + np.array([849, 635, 849, 635], dtype=np.float64))
    np.testing.assert_array_equal(neon_predictions.to_photograph(boxes, np.array([0, 400, 400, 800])),
                                  boxes + [0, 400, 0, 400])
    assert neon_predictions.to_photograph(np.zeros((0, 4)), (5, 5, 10, 10)).shape == (0, 4)


def test_merge_keeps_each_box_from_the_tile_nearest_its_centre():
    # photograph boxes, each seen by the tiles named; tile centres x 200, 600, 1000, 1049 (midpoints 400, 800, 1024.5)
    whole_in_3_and_4 = np.array([960, 50, 1000, 90])  # centre x 980: tile 3's
    also_whole_in_both = np.array([1040, 10, 1100, 60])  # centre x 1070: tile 4's
    on_the_midpoint = np.array([1014.5, 200, 1034.5, 220])  # centre x 1024.5, as near tile 3 as tile 4: the earlier
    left_part, right_part = np.array([380, 100, 400, 130]), np.array([400, 100, 430, 130])  # a crown cut at x 400
    seen = [[left_part], [right_part], [whole_in_3_and_4, also_whole_in_both, on_the_midpoint],
            [whole_in_3_and_4, also_whole_in_both, on_the_midpoint]]
    boxes = [np.array(found, dtype=np.float64) - np.array(window[:2] * 2) for found, window in zip(seen, ROW)]
    values = [np.arange(len(found)) + 10 * tile for tile, found in enumerate(seen)]
    merged, kept_values = neon_predictions.merge_tiles(ROW, boxes, values)
    np.testing.assert_array_equal(merged, np.array([left_part, right_part, whole_in_3_and_4, on_the_midpoint,
                                                    also_whole_in_both], dtype=np.float64))
    np.testing.assert_array_equal(kept_values, [0, 10, 20, 22, 31])


def test_merge_of_tiles_without_boxes_is_empty():
    merged, values = neon_predictions.merge_tiles(ROW[:2], [np.zeros((0, 4))] * 2, [np.zeros(0)] * 2)
    assert merged.shape == (0, 4) and values.shape == (0, )


def write_tiles(folder, photograph, windows):
    """Each window's crop of ``photograph`` as a PNG in ``folder``; their paths."""
    paths = []
    for x0, y0, x1, y1 in windows:
        paths.append(str(folder / f'tile_x{x0:04d}_y{y0:04d}.png'))
        Image.fromarray(photograph[y0:y1, x0:x1]).save(paths[-1])
    return paths


def test_the_photograph_is_pasted_back_from_its_tiles(tmp_path):
    photograph = np.random.default_rng(0).integers(0, 256, (70, 90, 3), dtype=np.uint8)
    # the tool's own tiling: 40 px tiles, the last of each row and column moved back to the edge
    windows = [(x, y, x + 40, y + 40) for y in tile_origins(70, 40, 0) for x in tile_origins(90, 40, 0)]
    assert (90 - 40, 70 - 40) in [w[:2] for w in windows] and len(windows) == 6
    paths = write_tiles(tmp_path, photograph, windows)
    pasted, origin = neon_predictions.read_photograph(paths, windows)
    np.testing.assert_array_equal(pasted, photograph)
    assert origin == (0, 0)
    # the validation band's tiles start below a guard band: their part of the photograph, with its corner
    band, band_origin = neon_predictions.read_photograph(paths[3:], windows[3:])
    np.testing.assert_array_equal(band, photograph[30:])
    assert band_origin == (0, 30)


def test_tiles_that_the_windows_do_not_describe_are_refused(tmp_path):
    photograph = np.random.default_rng(1).integers(0, 256, (40, 60, 3), dtype=np.uint8)
    windows = [(0, 0, 40, 40), (20, 0, 60, 40)]
    paths = write_tiles(tmp_path, photograph, windows)
    with pytest.raises(ValueError, match='differs from the tiles before it where their windows overlap'):
        neon_predictions.read_photograph(paths, [(0, 0, 40, 40), (19, 0, 59, 40)])
    with pytest.raises(ValueError, match='is 40 x 40 px but its window'):
        neon_predictions.read_photograph(paths, [(0, 0, 40, 40), (20, 0, 60, 41)])


def test_matching_at_iou_half_is_one_to_one_by_score():
    trees = np.array([[0, 0, 10, 10], [20, 0, 30, 10]], dtype=np.float64)
    boxes = np.array([
        [0, 0, 10, 20],  # IoU with the first tree 100 / 200 = 0.5: a match
        [0, 0, 10, 10],  # IoU 1 with the first tree, 0 with the second
        [20, 0, 30, 21],  # IoU with the second tree 100 / 210 = 0.476: no match
        [19, 0, 30, 10],  # IoU with the second tree 100 / 110: a match
    ], dtype=np.float64)
    # the first box scores higher and takes the first tree; the second finds it taken
    matched = neon_predictions.match(boxes, np.array([0.9, 0.8, 0.7, 0.6]), trees)
    np.testing.assert_array_equal(matched, [True, False, False, True])
    # the second box scores higher: it takes the first tree
    matched = neon_predictions.match(boxes, np.array([0.8, 0.9, 0.7, 0.6]), trees)
    np.testing.assert_array_equal(matched, [False, True, False, True])
    assert not neon_predictions.match(boxes, np.ones(4), np.zeros((0, 4))).any()
    assert neon_predictions.match(np.zeros((0, 4)), np.zeros(0), trees).shape == (0, )


def write_split(root, photograph, windows, annotations, split='test', source='photo'):
    """A split as tools/dataset/make_neon_trees.py writes it, with ``annotations`` as (tile index, photograph box,
    iscrowd)."""
    (root / split).mkdir(parents=True)
    (root / 'annotations').mkdir()
    images = []
    for index, (x0, y0, x1, y1) in enumerate(windows):
        name = f'{source}_x{x0:04d}_y{y0:04d}.png'
        Image.fromarray(photograph[y0:y1, x0:x1]).save(root / split / name)
        images.append(dict(id=index + 1, file_name=name, width=x1 - x0, height=y1 - y0, source=source,
                           window=[x0, y0, x1, y1]))
    coco_annotations = []
    for number, (tile, (x0, y0, x1, y1), iscrowd) in enumerate(annotations):
        left, top = windows[tile][:2]
        coco_annotations.append(dict(id=number + 1, image_id=tile + 1, category_id=1, iscrowd=iscrowd,
                                     bbox=[x0 - left, y0 - top, x1 - x0, y1 - y0], area=(x1 - x0) * (y1 - y0)))
    coco = dict(images=images, annotations=coco_annotations, categories=[dict(id=1, name='tree')])
    (root / 'annotations' / f'instances_{split}.json').write_text(json.dumps(coco))


def random_checkpoint(path, config=CONFIG):
    """A checkpoint of ``config``'s model as initialised (seed 0)."""
    from mmdet.registry import MODELS
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    init_default_scope('mmdet')
    torch.manual_seed(0)
    model = MODELS.build(Config.fromfile(config).model)
    model.init_weights()
    torch.save({'state_dict': model.state_dict(), 'meta': {'dataset_meta': {'classes': ['tree']}}}, path)


def box_iou(box, boxes):
    """IoU of one x0 y0 x1 y1 box with each of (N, 4) boxes, in float64."""
    inner = np.clip(np.minimum(box[2:], boxes[:, 2:]) - np.maximum(box[:2], boxes[:, :2]), 0, None).prod(axis=1)
    return inner / ((box[2:] - box[:2]).prod() + (boxes[:, 2:] - boxes[:, :2]).prod(axis=1) - inner)


@pytest.mark.slow
def test_a_random_detector_drawn_on_a_two_tile_photograph(tmp_path, monkeypatch):
    photograph = np.random.default_rng(2).integers(0, 256, (100, 64, 3), dtype=np.uint8)
    windows = [(0, 0, 64, 64), (0, 36, 64, 100)]  # overlapping rows 36-64, split at row 50
    crown, ignore = (10, 40, 20, 48), (40, 90, 50, 100)
    # the crown whole in both tiles (its centre, row 44, the first tile's), the ignore region in the second only
    write_split(tmp_path / 'data', photograph, windows, [(0, crown, 0), (1, crown, 0), (1, ignore, 1)])
    random_checkpoint(tmp_path / 'random.pth')
    (tmp_path / 'metrics.json').write_text(json.dumps({'coco/bbox_mAP': 0.123}))
    per_tile = {}  # the model's own boxes on each tile, as the tool gets them

    def recorded(*args, predict=neon_predictions.predict):
        per_tile[args[-1]] = predict(*args)
        return per_tile[args[-1]]

    monkeypatch.setattr(neon_predictions, 'predict', recorded)
    result = run_main(neon_predictions.main, SCRIPT, CONFIG, str(tmp_path / 'random.pth'), '--labels', 'random',
                      '--data-root', str(tmp_path / 'data'), '--out-dir', str(tmp_path / 'out'), '--score-thr',
                      '0.3', '--metrics', str(tmp_path / 'metrics.json'), '--dpi', '40')
    assert result.returncode == 0, result.stderr[-3000:]
    with Image.open(tmp_path / 'out' / 'photo.png') as image:
        assert image.width == 2 * 6 * 40 and image.width > image.height > 0  # two panels of 6 inches at 40 dpi
    record = json.loads((tmp_path / 'out' / 'photo.json').read_text())
    assert record['size'] == [64, 100] and record['origin'] == [0, 0] and record['tiles'] == 2
    assert record['ground_truth'] == dict(trees=[list(map(float, crown))], ignore=[list(map(float, ignore))])
    model = record['models']['random']
    boxes, scores = np.array(model['boxes']).reshape(-1, 4), np.array(model['scores'])
    assert len(boxes) == len(scores) > 0
    assert (boxes[:, :2] >= 0).all() and (boxes[:, 2] <= 64).all() and (boxes[:, 3] <= 100).all()
    # the reference: each tile's boxes moved down by its window, the first tile's kept above row 50 (and on it),
    # the second's below
    expected = []
    for (tile_boxes, tile_scores), (x0, y0, _, _) in zip(per_tile['random'], windows):
        placed = tile_boxes + np.array([x0, y0, x0, y0], dtype=np.float64)
        middle = (placed[:, 1] + placed[:, 3]) / 2
        keep = middle <= 50 if y0 == 0 else middle > 50
        expected.append(np.column_stack([placed[keep], tile_scores[keep]]))
    expected = np.concatenate(expected)
    np.testing.assert_allclose(np.column_stack([boxes, scores]), expected, rtol=0, atol=1e-4)
    assert (boxes[:, 3] > 64).any()  # only the second tile reaches below row 64
    shown = expected[expected[:, 4] >= 0.3]
    assert model['above_thr'] == len(shown)
    assert model['matched'] == int((box_iou(np.array(crown, dtype=np.float64), shown[:, :4]) >= 0.5).any())
    assert model['ap'] == pytest.approx(12.3)
    (row, ) = [line.split() for line in result.stdout.splitlines() if line.startswith('random ')]
    assert row == ['random', str(len(shown)), str(model['matched']), '1']


def test_a_checkpoint_that_would_run_code_is_refused(tmp_path):
    class MakesADirectory:
        def __reduce__(self):
            return os.makedirs, (str(tmp_path / 'made by the checkpoint'), )

    torch.save({'state_dict': {}, 'meta': {'note': MakesADirectory()}}, tmp_path / 'unsafe.pth')
    with pytest.raises(UnsafeCheckpointError, match='makedirs'):
        neon_predictions.predict(CONFIG, str(tmp_path / 'unsafe.pth'), [], 'unsafe')
    assert not (tmp_path / 'made by the checkpoint').exists()


def test_clear_errors_before_any_model_runs(tmp_path):
    checkpoint = tmp_path / 'model.pth'
    checkpoint.write_bytes(b'never read')

    def run(*args):
        return run_main(neon_predictions.main, SCRIPT, *args, '--out-dir', str(tmp_path / 'out'))

    result = run(CONFIG, str(checkpoint), CONFIG, '--labels', 'a', 'b')
    assert result.returncode == 2 and '3 paths given: give a CONFIG CHECKPOINT pair for each model' in result.stderr
    result = run(CONFIG, str(checkpoint), CONFIG, str(checkpoint), '--labels', 'baseline')
    assert result.returncode == 2 and '1 labels (baseline) for 2 models' in result.stderr
    result = run(CONFIG, str(checkpoint), '--labels', 'a', '--metrics', 'one.json', 'two.json')
    assert result.returncode == 2 and '2 --metrics files for 1 models' in result.stderr
    result = run(CONFIG, str(tmp_path / 'missing.pth'), '--labels', 'a')
    assert result.returncode == 2 and f'no such file: {tmp_path / "missing.pth"}' in result.stderr

    photograph = np.zeros((40, 40, 3), dtype=np.uint8)
    write_split(tmp_path / 'data', photograph, [(0, 0, 40, 40)], [])
    ann_file = tmp_path / 'data' / 'annotations' / 'instances_test.json'
    coco = json.loads(ann_file.read_text())
    del coco['images'][0]['window']
    ann_file.write_text(json.dumps(coco))
    result = run(CONFIG, str(checkpoint), '--labels', 'a', '--data-root', str(tmp_path / 'data'))
    assert result.returncode == 1
    assert 'the image photo_x0000_y0000.png has no window, so its tile cannot be placed' in result.stderr
    result = run(CONFIG, str(checkpoint), '--labels', 'a', '--data-root', str(tmp_path / 'data'), '--split', 'val')
    assert result.returncode == 1 and 'instances_val.json: no such annotation file' in result.stderr
    assert not (tmp_path / 'out').exists()
