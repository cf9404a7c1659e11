"""tools/dataset/make_shapes.py: a dataset of another size is never taken for the one asked for, and a larger
validation set starts with the smaller one's images (configs/suites/_base_/demo_12e_val200.py relies on it)."""
import json
import os.path as osp
import subprocess
import sys

import pytest

from condtok_mm.datasets import make_shapes
from helpers.repo import REPO_ROOT, run_main

TOOL = osp.join(REPO_ROOT, 'tools', 'dataset', 'make_shapes.py')


def make(out_dir, num_val, *more):
    """``python tools/dataset/make_shapes.py`` run in this process (:func:`helpers.repo.run_main`)."""
    return run_main(make_shapes.main, TOOL, '--out-dir', str(out_dir), '--num-train', '2', '--num-val', str(num_val),
                    '--size', '48', '48', *more)


def test_other_counts_into_an_existing_dataset_are_refused_and_the_same_are_kept(tmp_path):
    assert make(tmp_path / 'small', 2).returncode == 0
    again = make(tmp_path / 'small', 2)
    assert again.returncode == 0 and 'shapes dataset already at' in again.stdout
    refused = make(tmp_path / 'small', 3)
    assert refused.returncode == 1
    assert 'has 2 train, 2 val images, not the 2 train, 3 val asked for; give another --out-dir' in refused.stderr
    refused = make(tmp_path / 'small', 2, '--num-test', '2')
    assert refused.returncode == 1 and 'has 2 train, 2 val images, not the 2 train, 2 val, 2 test' in refused.stderr


def test_a_test_split_is_drawn_from_its_own_stream_and_leaves_the_others_as_they_were(tmp_path):
    assert make(tmp_path / 'plain', 2).returncode == 0
    with_test = make(tmp_path / 'held_out', 2, '--num-test', '3')
    assert with_test.returncode == 0 and 'wrote 2 train, 2 val and 3 test images' in with_test.stdout
    for split in ('train', 'val'):
        plain, held_out = (tmp_path / name for name in ('plain', 'held_out'))
        assert ((plain / 'annotations' / f'instances_{split}.json').read_bytes()
                == (held_out / 'annotations' / f'instances_{split}.json').read_bytes())
        assert sorted(p.name for p in (plain / split).iterdir()) == sorted(p.name for p in (held_out / split).iterdir())
        for image in (plain / split).iterdir():
            assert image.read_bytes() == (held_out / split / image.name).read_bytes()
    assert not (tmp_path / 'plain' / 'annotations' / 'instances_test.json').exists()
    test = json.load(open(tmp_path / 'held_out' / 'annotations' / 'instances_test.json'))
    assert len(test['images']) == 3 and test['annotations']
    val_images = {p.read_bytes() for p in (tmp_path / 'held_out' / 'val').iterdir()}
    assert not val_images & {p.read_bytes() for p in (tmp_path / 'held_out' / 'test').iterdir()}


def test_a_larger_validation_set_begins_with_the_smaller_ones_images(tmp_path):
    assert make(tmp_path / 'small', 2).returncode == 0 and make(tmp_path / 'large', 3).returncode == 0
    small, large = (json.load(open(tmp_path / name / 'annotations' / 'instances_val.json')) for name in ('small', 'large'))
    assert large['images'][:2] == small['images'] and len(large['images']) == 3
    assert [a for a in large['annotations'] if a['image_id'] in {i['id'] for i in small['images']}] == small['annotations']
    for image in small['images']:
        assert ((tmp_path / 'small' / 'val' / image['file_name']).read_bytes()
                == (tmp_path / 'large' / 'val' / image['file_name']).read_bytes())
    train = [(tmp_path / name / 'annotations' / 'instances_train.json').read_text() for name in ('small', 'large')]
    assert train[0] == train[1]


@pytest.mark.slow
def test_the_script_runs_as_a_command(tmp_path):
    """The tests above call its main() in this process; this one runs ``python tools/dataset/make_shapes.py``."""
    result = subprocess.run([sys.executable, TOOL, '--out-dir', str(tmp_path / 'shapes'), '--num-train', '2',
                             '--num-val', '2', '--size', '48', '48'], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith(f'wrote 2 train, 2 val images to {tmp_path / "shapes"} in ')
    assert len(json.load(open(tmp_path / 'shapes' / 'annotations' / 'instances_val.json'))['images']) == 2


@pytest.mark.parametrize('options, message', [
    (['--num-train', '-3'], '--num-train -3: a split needs at least 1 image'),
    (['--num-val', '0'], '--num-val 0: a split needs at least 1 image'),
    (['--size', '8', '8'], '--size 8 8: images need sides of at least 32 pixels'),
    (['--num-test', '-1'], '--num-test -1: give 0 (no test split) or more images'),
])
def test_a_dataset_without_annotations_is_refused_before_anything_is_written(tmp_path, options, message):
    result = run_main(make_shapes.main, TOOL, '--out-dir', str(tmp_path / 'shapes'), *options)
    assert result.returncode == 2 and message in result.stderr
    assert not (tmp_path / 'shapes').exists()
