"""tools/benchmark/window_conditioning.py at a small fraction of its image sizes."""
import json
import math
import os.path as osp
import subprocess
import sys

import pytest

from helpers.repo import REPO_ROOT


@pytest.mark.slow
def test_window_benchmark_times_both_scopes_and_meets_the_bound_per_window(tmp_path):
    result = subprocess.run(
        [sys.executable, osp.join(REPO_ROOT, 'tools', 'benchmark', 'window_conditioning.py'), '--scale', '0.125',
         '--batch', '1', '--repeats', '2', '--warmup', '0', '--threads', '1', '--out-dir', str(tmp_path)],
        capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.load(open(tmp_path / 'window_conditioning.json'))
    # 1/8 of 800 x 1333 (Swin-T: stride-4 patches, the width padded to 168) and of 1024 x 1024 (ViT-B: 16)
    assert [(r['case'], r['grid'], r['channels'], r['window_size']) for r in summary['results']] == [
        ('Swin-T stage 0, 100x167', [25, 42], 96, 7), ('ViT-B, 128x128', [8, 8], 768, 14),
        ('ViT-B, 128x128 LSJ 0.5', [8, 8], 768, 14)]
    for row in summary['results']:
        (height, width), size = row['grid'], row['window_size']
        assert row['windows_per_image'] == math.ceil(height / size) * math.ceil(width / size)  # 24, 1, 1
        assert row['image_max_kappa_after'] <= 2 + 1e-3 and row['window_max_kappa_after'] <= 2 + 1e-3
        for scope in ('image', 'window'):
            times = row[f'{scope}_ms_all']
            assert len(times) == 2 and row[f'{scope}_ms_min'] == pytest.approx(min(times), abs=0.05)
        assert row['ratio'] == row['window_ms_median'] / row['image_ms_median']
        assert f'{row["case"]:<26}' in result.stdout
    assert summary['machine']['torch_threads'] == 1 and 'machine:' in result.stdout
    assert (tmp_path / 'window_conditioning.png').read_bytes()[:4] == b'\x89PNG'
