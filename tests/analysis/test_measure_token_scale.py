"""tools/analysis/measure_token_scale.py: the token scale r = ||X + C|| / ||X|| of each dose, against numpy."""
import json
import os.path as osp
import subprocess
import sys

import numpy as np
import pytest
import torch

import condtok_mm  # noqa: F401
from condtok_mm.analysis import measure_token_scale
from helpers.repo import DEMO, REPO_ROOT


DOSES = [('k1.25', dict(target_kappa=1.25)), ('k2', dict(target_kappa=2.0)), ('k8', dict(target_kappa=8.0)),
         ('graying', dict(mode='graying', epsilon=0.95))]


def numpy_scale(x, dose):
    """r of one (N, d) token matrix, N >= d: sigma_max shifts every singular value by s_1 / (t - 1); Token
    Graying maps them to (s / s_1) ** epsilon."""
    s = np.linalg.svd(x, compute_uv=False)
    if dose.get('mode') == 'graying':
        lifted = (s / s[0]) ** dose['epsilon']
    else:
        lifted = s + s[0] / (dose['target_kappa'] - 1)
    return np.sqrt((lifted ** 2).sum() / (s ** 2).sum())


@pytest.mark.parametrize('control', [None, 'norm_matched'])
def test_each_dose_gives_the_numpy_scale_of_x_plus_c_on_each_images_valid_tokens(control):
    """A padded batch: image 0 fills its 8 x 10 grid, image 1 only the top-left 5 x 6; the config's own
    control is dropped, so a norm-matched config still measures the scale X + C would have."""
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randn(2, 80, 16, generator=generator, dtype=torch.float64)
    tokens[:, :, 0] *= 50  # ill-conditioned, as embedded tokens are
    valid = [(8, 10), (5, 6)]
    conditioners = measure_token_scale.dose_conditioners(
        dict(type='TokenConditioner', mode='sigma_max', target_kappa=2.0, control=control), DOSES)
    scales = measure_token_scale.token_scales(tokens, (8, 10), valid, conditioners)
    grid = tokens.reshape(2, 8, 10, 16).numpy()
    for name, dose in DOSES:
        expected = [numpy_scale(grid[i, :h, :w].reshape(h * w, 16), dose) for i, (h, w) in enumerate(valid)]
        assert scales[name] == pytest.approx(expected, rel=1e-5), name  # the batched s_1 is an upper bound
    assert scales['k1.25'][0] > scales['k2'][0] > scales['k8'][0] > 1 > scales['graying'][0]


def test_all_zero_tokens_raise_a_clear_error():
    conditioners = measure_token_scale.dose_conditioners(dict(type='TokenConditioner'), DOSES[:1])
    with pytest.raises(ValueError, match='all-zero tokens'):
        measure_token_scale.token_scales(torch.zeros(1, 16, 4), (4, 4), None, conditioners)


def test_doses_parse_as_literals_and_bad_ones_name_the_fix():
    assert measure_token_scale.parse_dose(['g', 'mode=graying', 'epsilon=0.6']) == ('g', dict(mode='graying', epsilon=0.6))
    with pytest.raises(ValueError, match='is not KEY=VALUE'):
        measure_token_scale.parse_dose(['k', 'target_kappa'])
    with pytest.raises(SystemExit):
        measure_token_scale.parse_args([DEMO, '--dose', 'a', 'target_kappa=2', '--dose', 'a', 'target_kappa=3'])


def run_tool(config, shapes_root, tmp_path):
    options = [f'val_dataloader.dataset.data_root={shapes_root}/', 'val_dataloader.num_workers=0',
               'val_dataloader.persistent_workers=False']
    dose_args = [arg for name, dose in DOSES for arg in ('--dose', name, *(f'{k}={v}' for k, v in dose.items()))]
    return subprocess.run(
        [sys.executable, osp.join(REPO_ROOT, 'tools', 'analysis', 'measure_token_scale.py'), config, *dose_args,
         '--num-images', '3', '--out-dir', str(tmp_path), '--cfg-options', *options],
        capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_the_tool_measures_the_demos_initial_tokens_and_writes_table_json_and_png(shapes_root, tmp_path):
    result = run_tool(DEMO, shapes_root, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert '| initialization (seed 0) |' in result.stdout
    measured = json.load(open(tmp_path / 'token_scale.json'))
    r = measured['models'][0]['r']
    assert measured['models'][0]['num_images'] == 3 and len(r['k2']['per_image']) == 3
    assert r['k1.25']['min'] > r['k2']['max'] and r['k2']['min'] > r['k8']['max']
    assert r['k8']['min'] > 1 > r['graying']['max']
    assert (tmp_path / 'token_scale.png').read_bytes()[:4] == b'\x89PNG'


@pytest.mark.slow
def test_a_config_without_conditioning_is_refused_by_name(shapes_root, tmp_path):
    baseline = osp.join(REPO_ROOT, 'configs', 'demo', 'mask-rcnn_swin-mini_fpn_12e_shapes.py')
    result = run_tool(baseline, shapes_root, tmp_path)
    assert result.returncode != 0
    assert 'has no model.backbone.conditioning' in result.stderr


@pytest.mark.slow
def test_a_checkpoint_is_measured_on_its_weights_and_no_checkpoint_on_a_seeded_initialization(shapes_root, tmp_path):
    """A checkpoint of the initialization that mmengine's seed and init_weights give is measured as that
    initialization is without a checkpoint, and another seed's differs."""
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    from mmengine.runner.utils import set_random_seed
    from condtok_mm.registry import MODELS

    cfg = Config.fromfile(DEMO)
    cfg.merge_from_dict({'val_dataloader.dataset.data_root': f'{shapes_root}/', 'val_dataloader.num_workers': 0,
                         'val_dataloader.persistent_workers': False})
    init_default_scope('mmdet')
    set_random_seed(1)
    model = MODELS.build(cfg.model)
    model.init_weights()
    checkpoint = str(tmp_path / 'init.pth')
    torch.save({'state_dict': model.state_dict()}, checkpoint)
    bar = type('Bar', (), {'update': lambda self, n: None})()
    from_checkpoint = measure_token_scale.measure(cfg, checkpoint, DOSES, 2, 0, bar)
    from_seed = measure_token_scale.measure(cfg, None, DOSES, 2, 1, bar)
    for name, _ in DOSES:
        assert from_seed[name] == pytest.approx(from_checkpoint[name], rel=1e-12)
    assert measure_token_scale.measure(cfg, None, DOSES, 2, 2, bar)['k2'] != pytest.approx(from_checkpoint['k2'], rel=1e-3)
