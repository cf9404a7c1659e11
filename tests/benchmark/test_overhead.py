import json
import os.path as osp
import statistics
import subprocess
import sys

import pytest
from mmengine.config import Config
from mmengine.registry import init_default_scope

import condtok_mm  # noqa: F401
from condtok_mm.registry import MODELS

from conftest import REPO_ROOT


@pytest.mark.slow
def test_overhead_benchmark_times_both_twins_and_checks_the_conditioner(tmp_path):
    """A small Swin-T Mask R-CNN pair: medians of both phases, peak memory of both, the conditioner against
    the plain SVD on the tokens the model's conditioner received, kappa <= 2 after both."""
    result = subprocess.run(
        [sys.executable, osp.join(REPO_ROOT, 'tools', 'benchmark', 'overhead.py'), '--models', 'swin-t',
         '--size', '120', '150', '--repeats', '2', '--conditioner-repeats', '1', '--device', 'cpu',
         '--out-dir', str(tmp_path)], capture_output=True, text=True, timeout=600, cwd=REPO_ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.load(open(tmp_path / 'overhead.json'))
    swin = summary['results']['swin-t']
    assert swin['size'] == [120, 150] and swin['step_goal_percent'] == 1.0
    for phase in ('train', 'inference'):
        times = swin['times'][phase]
        assert all(len(times[variant]) == 2 for variant in ('baseline', 'conditioned'))
        base, cond = statistics.median(times['baseline']), statistics.median(times['conditioned'])
        assert (swin[phase]['baseline_s'], swin[phase]['conditioned_s']) == (base, cond)
        assert swin[phase]['overhead_percent'] == pytest.approx(100 * (cond / base - 1))
    process = swin['memory']['peaks']['process']
    assert swin['memory']['kind'] == 'peak RSS of the process'
    # At its peak each process holds the weights, their gradients and AdamW's two moments: 16 bytes a parameter
    cfg = Config.fromfile(osp.join(REPO_ROOT, swin['conditioned_config']))
    init_default_scope('mmdet')
    parameters = sum(p.numel() for p in MODELS.build(cfg.model).parameters())
    assert process['baseline_bytes'] > 16 * parameters and process['conditioned_bytes'] > 16 * parameters
    assert process['overhead_percent'] == pytest.approx(
        100 * (process['conditioned_bytes'] / process['baseline_bytes'] - 1))
    conditioner = swin['conditioner']
    # stride-4 patch embedding of 120 x 150 padded to 128 x 160: the conditioner sees 30 x 38 valid tokens
    assert conditioner['tokens_shape'] == [1, 32 * 40, 96] and conditioner['valid_shapes'] == [[30, 38]]
    floor = conditioner['floor (two float64 products)']['seconds']
    assert conditioner['conditioner']['times_floor'] == conditioner['conditioner']['seconds'] / floor
    assert 'x the floor (goal <= 1.5x' in result.stdout
    for implementation in ('conditioner', 'torch.linalg.svd'):
        assert conditioner[implementation]['kappa_before_max'] > 10
        assert conditioner[implementation]['kappa_after_max'] == pytest.approx(2.0, abs=1e-3)
    assert (tmp_path / 'overhead.png').read_bytes()[:4] == b'\x89PNG'
    assert 'swin-t    train' in result.stdout and 'machine:' in result.stdout
    assert 'paramwise_options' not in result.stdout + result.stderr


@pytest.mark.slow
def test_overhead_benchmark_puts_the_comparison_methods_side_by_side(tmp_path):
    """--methods: spectral conditioning and Token Graying timed in the same interleaved rounds as the twins."""
    result = subprocess.run(
        [sys.executable, osp.join(REPO_ROOT, 'tools', 'benchmark', 'overhead.py'), '--models', 'swin-t',
         '--methods', 'spectral', 'graying', '--size', '64', '96', '--repeats', '1', '--conditioner-repeats', '1',
         '--device', 'cpu', '--skip-memory', '--out-dir', str(tmp_path)],
        capture_output=True, text=True, timeout=900, cwd=REPO_ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    swin = json.load(open(tmp_path / 'overhead.json'))['results']['swin-t']
    assert list(swin['methods']) == ['conditioned', 'spectral', 'graying']
    for method, measured in swin['methods'].items():
        assert measured['train']['config'] == f'configs/swin/mask-rcnn_swin-t-p4-w7-{method}_fpn_1x_coco.py'.replace(
            '-conditioned_', '-condtok_')
        for phase in ('train', 'inference'):
            (seconds, ) = swin['times'][phase][method]
            assert measured[phase]['seconds'] == seconds
            assert measured[phase]['overhead_percent'] == pytest.approx(
                100 * (seconds / swin[phase]['baseline_s'] - 1))
    # graying has a conditioner of its own, timed alone; spectral has none (nothing to time: no extra pass)
    assert swin['methods']['graying']['conditioner']['seconds'] > 0
    assert 'conditioner' not in swin['methods']['spectral']
    assert 'swin-t    spectral' in result.stdout and 'swin-t    graying' in result.stdout
