"""The NEON tree-crown dataset builder on a small fake deepforest wheel written here: tiling, box clipping, empty
tiles, the split rule and its guard band, the class merge, the digest refusal, idempotence and safe XML parsing.
Nothing is downloaded."""
import functools
import json
import os
import os.path as osp
import zipfile

import numpy as np
import pytest
from PIL import Image

from condtok_mm.datasets import neon_trees
from condtok_mm.datasets.neon_trees import (OTHER_SITE_IMAGES, TEST_IMAGE, TRAIN_IMAGE, build, clip_box,
                                            make_neon_trees_dataset, read_voc, sha256_of, tile_origins)
from condtok_mm.datasets import make_neon_trees
from helpers.repo import REPO_ROOT, run_main

TOOL = osp.join(REPO_ROOT, 'tools', 'dataset', 'make_neon_trees.py')
# tile 40, no overlap; the 80 x 110 training image: training rows [0, 70), guard [70, 80), validation [80, 110)
OPTIONS = dict(tile=40, overlap=0, val_rows=30, guard=10, min_visible=0.5)
# (width, height, [(label, box)]) of each fake source image
SOURCES = {
    TRAIN_IMAGE: (80, 110, [
        ('Tree', (5, 5, 25, 25)),  # inside the first tile
        ('Tree', (30, 10, 50, 20)),  # halved by x = 40: half in each tile, a tree in both
        ('Tree', (70, 50, 80, 66)),
        ('Tree', (10, 35, 20, 45)),  # half in the first row of tiles, whole in the second (they overlap: 30-40)
        ('Tree', (44, 36, 54, 56)),  # a fifth in the first row: an ignore region there
        ('Tree', (39.5, 2, 49, 12)),  # half a pixel in the first tile: nothing there
        ('Tree', (60, 66, 70, 74)),  # half above the guard band
        ('Tree', (50, 72, 60, 78)),  # inside the guard band: in no tile
        ('Tree', (5, 85, 25, 100)),  # validation
    ]),
    TEST_IMAGE: (50, 40, [('Tree', (0, 0, 10, 10))]),  # touches the second tile's edge: not in it
    OTHER_SITE_IMAGES[0]: (30, 30, [('Tree', (2, 2, 12, 12))]),
    OTHER_SITE_IMAGES[1]: (30, 30, [('Dead', (1, 1, 5, 5)), ('Alive', (10, 10, 20, 20))]),
}
# file name -> [x, y, w, h, iscrowd] of each annotation, worked out by hand from SOURCES and the rule
EXPECTED = {
    'train': {
        f'{TRAIN_IMAGE}_x0000_y0000.png': [[5, 5, 20, 20, 0], [30, 10, 10, 10, 0], [10, 35, 10, 5, 0]],
        f'{TRAIN_IMAGE}_x0040_y0000.png': [[0, 10, 10, 10, 0], [4, 36, 10, 4, 1], [0, 2, 9, 10, 0]],
        f'{TRAIN_IMAGE}_x0000_y0030.png': [[10, 5, 10, 10, 0]],
        f'{TRAIN_IMAGE}_x0040_y0030.png': [[30, 20, 10, 16, 0], [4, 6, 10, 20, 0], [20, 36, 10, 4, 0]],
    },
    'val': {f'{TRAIN_IMAGE}_x0000_y0080.png': [[5, 5, 20, 15, 0]], f'{TRAIN_IMAGE}_x0040_y0080.png': []},
    'test': {f'{TEST_IMAGE}_x0000_y0000.png': [[0, 0, 10, 10, 0]], f'{TEST_IMAGE}_x0010_y0000.png': []},
    'other_sites': {f'{OTHER_SITE_IMAGES[0]}_x0000_y0000.png': [[2, 2, 10, 10, 0]],
                    f'{OTHER_SITE_IMAGES[1]}_x0000_y0000.png': [[1, 1, 4, 4, 0], [10, 10, 10, 10, 0]]},
}
WINDOWS = {'train': [(0, 0, 40, 40), (40, 0, 80, 40), (0, 30, 40, 70), (40, 30, 80, 70)],
           'val': [(0, 80, 40, 110), (40, 80, 80, 110)], 'test': [(0, 0, 40, 40), (10, 0, 50, 40)],
           'other_sites': [(0, 0, 30, 30), (0, 0, 30, 30)]}


def voc(width, height, objects, doctype=''):
    parts = [f'{doctype}<annotation><filename>x.png</filename>',
             f'<size><width>{width}</width><height>{height}</height><depth>3</depth></size>']
    for label, (xmin, ymin, xmax, ymax) in objects:
        parts.append(f'<object><name>{label}</name><difficult>0</difficult><bndbox><xmin>{xmin}</xmin>'
                     f'<ymin>{ymin}</ymin><xmax>{xmax}</xmax><ymax>{ymax}</ymax></bndbox></object>')
    return ('\n'.join(parts) + '</annotation>').encode()


def source_pixels(stem):
    width, height, _ = SOURCES[stem]
    return np.random.default_rng(sorted(SOURCES).index(stem)).integers(0, 256, (height, width, 3), dtype=np.uint8)


def write_wheel(path, sources=SOURCES):
    with zipfile.ZipFile(path, 'w') as archive:
        for stem, (width, height, objects) in sources.items():
            png = osp.join(osp.dirname(path), f'{stem}.png')
            Image.fromarray(source_pixels(stem)).save(png)
            archive.write(png, f'deepforest/data/{stem}.png')
            archive.writestr(f'deepforest/data/{stem}.xml', voc(width, height, objects))
        archive.writestr('deepforest-2.1.0.dist-info/licenses/LICENSE', 'MIT License\n')
    return str(path)


@pytest.fixture
def wheel(tmp_path):
    return write_wheel(tmp_path / 'deepforest-2.1.0-py3-none-any.whl')


def annotations(root, split):
    with open(osp.join(root, 'annotations', f'instances_{split}.json')) as f:
        return json.load(f)


def boxes_by_tile(coco):
    """file name -> [x, y, w, h, iscrowd] of each annotation of that tile, in the file's order."""
    return {image['file_name']: [a['bbox'] + [a['iscrowd']] for a in coco['annotations']
                                 if a['image_id'] == image['id']] for image in coco['images']}


def test_tiles_are_full_sized_cover_the_axis_and_the_last_one_ends_at_the_edge():
    assert tile_origins(100, 40, 10) == [0, 30, 60]
    assert tile_origins(105, 40, 10) == [0, 30, 60, 65]
    assert tile_origins(80, 40, 0) == [0, 40]
    assert tile_origins(30, 40, 0) == [0]  # shorter than a tile: one window of its own size


def test_a_box_is_a_tree_from_half_visible_an_ignore_region_below_and_nothing_under_a_pixel():
    box = (10, 10, 30, 30)
    assert clip_box(box, (0, 0, 20, 40), 0.5) == ([10, 10, 10, 20], 0)  # half of it inside
    assert clip_box(box, (0, 0, 15, 40), 0.5) == ([10, 10, 5, 20], 1)  # a quarter
    assert clip_box(box, (5, 2, 45, 42), 0.5) == ([5, 8, 20, 20], 0)  # in the window's coordinates
    assert clip_box(box, (0, 0, 10.5, 40), 0.5) == (None, None)
    assert clip_box(box, (30, 0, 70, 40), 0.5) == (None, None)  # touches the edge only


def test_each_split_holds_its_images_tiles_with_the_clipped_boxes(wheel, tmp_path):
    counts = build(wheel, str(tmp_path / 'neon'), **OPTIONS)
    for split, expected in EXPECTED.items():
        coco = annotations(tmp_path / 'neon', split)
        assert boxes_by_tile(coco) == expected, split
        assert [tuple(image['window']) for image in coco['images']] == WINDOWS[split]
        for image in coco['images']:
            x0, y0, x1, y1 = image['window']
            pixels = np.asarray(Image.open(osp.join(tmp_path, 'neon', split, image['file_name'])))
            assert np.array_equal(pixels, source_pixels(image['source'])[y0:y1, x0:x1]), image['file_name']
            assert (image['width'], image['height']) == (x1 - x0, y1 - y0)
        assert all(a['area'] == a['bbox'][2] * a['bbox'][3] for a in coco['annotations'])
    assert counts == dict(train=dict(tiles=4, empty_tiles=0, boxes=9, ignore_regions=1, source_images=1),
                          val=dict(tiles=2, empty_tiles=1, boxes=1, ignore_regions=0, source_images=1),
                          test=dict(tiles=2, empty_tiles=1, boxes=1, ignore_regions=0, source_images=1),
                          other_sites=dict(tiles=2, empty_tiles=0, boxes=3, ignore_regions=0, source_images=2))


def test_overlapping_tiles_each_hold_a_shared_crown_clipped_to_their_own_window(wheel, tmp_path):
    build(wheel, str(tmp_path / 'neon'), **dict(OPTIONS, overlap=10))  # stride 30: x 0, 30, then 40 at the edge
    coco = annotations(tmp_path / 'neon', 'train')
    assert [tuple(image['window']) for image in coco['images']] == [
        (0, 0, 40, 40), (30, 0, 70, 40), (40, 0, 80, 40), (0, 30, 40, 70), (30, 30, 70, 70), (40, 30, 80, 70)]
    found = boxes_by_tile(coco)
    # the crown at x 30-50 is half in the first tile, whole in the middle one, half in the last: a tree in each
    assert found[f'{TRAIN_IMAGE}_x0030_y0000.png'] == [[0, 10, 20, 10, 0], [14, 36, 10, 4, 1], [9.5, 2, 9.5, 10, 0]]
    assert found[f'{TRAIN_IMAGE}_x0000_y0000.png'] == EXPECTED['train'][f'{TRAIN_IMAGE}_x0000_y0000.png']
    assert found[f'{TRAIN_IMAGE}_x0040_y0000.png'] == EXPECTED['train'][f'{TRAIN_IMAGE}_x0040_y0000.png']


def test_a_missing_wheel_is_named_with_the_command_that_fetches_it(tmp_path):
    with pytest.raises(FileNotFoundError, match='no such wheel; fetch it with `pip download --no-deps'):
        neon_trees.check_wheel(str(tmp_path / 'deepforest-2.1.0-py3-none-any.whl'))


def test_split_by_image_training_and_validation_rows_apart_and_the_test_image_alone(wheel, tmp_path):
    build(wheel, str(tmp_path / 'neon'), **OPTIONS)
    sources = {split: {image['source'] for image in annotations(tmp_path / 'neon', split)['images']}
               for split in EXPECTED}
    assert sources == dict(train={TRAIN_IMAGE}, val={TRAIN_IMAGE}, test={TEST_IMAGE},
                           other_sites=set(OTHER_SITE_IMAGES))
    train_rows = [image['window'][3] for image in annotations(tmp_path / 'neon', 'train')['images']]
    val_rows = [image['window'][1] for image in annotations(tmp_path / 'neon', 'val')['images']]
    assert max(train_rows) + OPTIONS['guard'] == min(val_rows) == 110 - OPTIONS['val_rows']


def test_a_crown_in_both_the_training_and_the_validation_rows_is_refused(wheel, tmp_path):
    # guard 0 and 40 validation rows: the box (60, 66, 70, 74) crosses row 70
    with pytest.raises(ValueError, match=r'\(60\.0, 66\.0, 70\.0, 74\.0\) lies in both .* wider than 0 rows'):
        build(wheel, str(tmp_path / 'neon'), **dict(OPTIONS, val_rows=40, guard=0))


def test_dead_and_alive_are_merged_into_tree_and_the_merge_is_recorded(wheel, tmp_path):
    build(wheel, str(tmp_path / 'neon'), **OPTIONS)
    for split in EXPECTED:
        coco = annotations(tmp_path / 'neon', split)
        assert [(c['id'], c['name']) for c in coco['categories']] == [(1, 'tree')]
        assert {a['category_id'] for a in coco['annotations']} <= {1}
        assert coco['info']['class_merge'] == {'Alive': 'tree', 'Dead': 'tree', 'Tree': 'tree'}
        assert coco['info']['source_labels'][OTHER_SITE_IMAGES[1]] == ['Alive', 'Dead']
        assert 'MIT' in coco['info']['licence']
    assert open(osp.join(tmp_path, 'neon', 'LICENSE')).read() == 'MIT License\n'


def test_mmdet_reads_the_ignore_regions_as_ignored_instances(wheel, tmp_path):
    from mmdet.datasets import CocoDataset
    build(wheel, str(tmp_path / 'neon'), **OPTIONS)
    dataset = CocoDataset(data_root=str(tmp_path / 'neon'), ann_file='annotations/instances_train.json',
                          data_prefix=dict(img='train/'), metainfo=dict(classes=('tree', )), test_mode=True,
                          lazy_init=False, pipeline=[])
    by_name = {osp.basename(info['img_path']): info for info in map(dataset.get_data_info, range(len(dataset)))}
    ignored = [i['ignore_flag'] for i in by_name[f'{TRAIN_IMAGE}_x0040_y0000.png']['instances']]
    assert ignored == [0, 1, 0]


def test_a_wheel_with_another_digest_is_refused_by_the_tool(wheel, tmp_path):
    result = run_main(make_neon_trees.main, TOOL, '--wheel', wheel, '--out-dir', str(tmp_path / 'neon'))
    assert result.returncode == 1
    assert f'SHA-256 {sha256_of(wheel)}, not the pinned {neon_trees.WHEEL_SHA256}' in result.stderr
    assert not osp.exists(tmp_path / 'neon')


def test_the_tool_prints_the_counts_the_source_and_the_licence(wheel, tmp_path, monkeypatch):
    monkeypatch.setattr(make_neon_trees, 'make_neon_trees_dataset',
                        functools.partial(make_neon_trees_dataset, sha256=sha256_of(wheel)))
    options = ['--tile', '40', '--val-rows', '30', '--guard', '10']
    result = run_main(make_neon_trees.main, TOOL, '--wheel', wheel, '--out-dir', str(tmp_path / 'neon'), *options)
    assert result.returncode == 0, result.stderr
    assert 'licence: MIT' in result.stdout and 'weecology/DeepForest' in result.stdout
    rows = {line.split()[0]: line.split()[1:] for line in result.stdout.splitlines()[3:]}
    assert rows == dict(train=['4', '0', '9', '1'], val=['2', '1', '1', '0'], test=['2', '1', '1', '0'],
                        other_sites=['2', '0', '3', '0'])


def test_a_second_run_changes_nothing_and_other_options_need_force(wheel, tmp_path):
    root = str(tmp_path / 'neon')
    digest = sha256_of(wheel)
    first, written = make_neon_trees_dataset(wheel, root, sha256=digest, **OPTIONS)
    assert written
    stamps = {name: os.stat(osp.join(root, name)).st_mtime_ns for name in first['files']}
    again, written = make_neon_trees_dataset(wheel, root, sha256=digest, **OPTIONS)
    assert not written and again == first
    assert {name: os.stat(osp.join(root, name)).st_mtime_ns for name in first['files']} == stamps
    with pytest.raises(FileExistsError, match='give another output folder or force'):
        make_neon_trees_dataset(wheel, root, sha256=digest, **dict(OPTIONS, overlap=10))
    os.remove(osp.join(root, 'val', f'{TRAIN_IMAGE}_x0040_y0080.png'))  # a damaged copy is made again, the same
    repaired, written = make_neon_trees_dataset(wheel, root, sha256=digest, **OPTIONS)
    assert written and repaired == first
    other, written = make_neon_trees_dataset(wheel, root, sha256=digest, force=True, **dict(OPTIONS, overlap=10))
    assert written and other['options']['overlap'] == 10 and not osp.exists(root + '.partial')


def test_a_folder_the_tool_did_not_write_is_left_alone(wheel, tmp_path):
    (tmp_path / 'neon').mkdir()
    (tmp_path / 'neon' / 'notes.txt').write_text('mine')
    with pytest.raises(FileExistsError, match='holds no manifest.json'):
        make_neon_trees_dataset(wheel, str(tmp_path / 'neon'), sha256=sha256_of(wheel), **OPTIONS)
    assert (tmp_path / 'neon' / 'notes.txt').read_text() == 'mine'


@pytest.mark.parametrize('content, message', [
    (voc(10, 10, [], doctype='<!DOCTYPE a [<!ENTITY b "cc">]>'), 'declares a DOCTYPE or ENTITY'),
    (voc(10, 10, [('Shrub', (1, 1, 5, 5))]), "object 0 has the label 'Shrub'"),
    (voc(10, 10, [('Tree', (1, 1, 11, 5))]), r'object 0 has the box \(1.0, 1.0, 11.0, 5.0\), not inside'),
    (voc(10, 10, [('Tree', (5, 1, 5, 5))]), 'with xmin < xmax'),
], ids=['doctype', 'label', 'outside', 'empty'])
def test_a_voc_file_with_an_entity_an_unknown_label_or_a_bad_box_is_refused(content, message):
    with pytest.raises(ValueError, match=message):
        read_voc(content, 'x.xml')


def test_a_voc_file_is_read_as_pixel_edges():
    assert read_voc(voc(30, 20, [('Dead', (1, 2, 30, 20))]), 'x.xml') == (30, 20, [('Dead', (1., 2., 30., 20.))])
