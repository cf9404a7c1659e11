"""tools/benchmark/hook_overhead.py on the demo model at a small input size."""
import json
import os.path as osp
import statistics
import subprocess
import sys

import pytest
from mmengine.config import Config

from helpers.repo import DEMO, REPO_ROOT


@pytest.mark.slow
def test_hook_benchmark_reports_the_recording_cost_per_interval(tmp_path):
    result = subprocess.run(
        [sys.executable, osp.join(REPO_ROOT, 'tools', 'benchmark', 'hook_overhead.py'), '--config', DEMO,
         '--size', '64', '96', '--batch', '1', '--repeats', '3', '--out-dir', str(tmp_path)],
        capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.load(open(tmp_path / 'hook_overhead.json'))
    assert (summary['size'], summary['batch'], summary['repeats']) == ([64, 96], 1, 3)
    assert len(summary['plain_s']) == len(summary['recording_s']) == 3
    step, recording = statistics.median(summary['plain_s']), statistics.median(summary['recording_s'])
    assert (summary['backbone_step_s'], summary['recording_step_s']) == (step, recording)
    assert summary['recording_cost_s'] == max(recording - step, 0.0)
    assert summary['overhead_percent'] == {
        str(k): pytest.approx(100 * summary['recording_cost_s'] / (k * step)) for k in (1, 10, 50, 100)}
    depths = Config.fromfile(DEMO).model.backbone.depths
    assert f'{sum(depths)} attention layers' in result.stdout  # every block of the demo Swin is probed
    assert (tmp_path / 'hook_overhead.png').read_bytes()[:4] == b'\x89PNG'
