"""mmdet's own analysis tools (from its installed package, .mim/tools/analysis_tools) run on our configs through
custom_imports alone: the commands of docs/en/user_guides/useful_tools.md, on the shapes data."""
import glob
import os.path as osp
import subprocess
import sys

import mmdet
import pytest

from helpers.cfg_options import data_options
from helpers.repo import DEMO, run_tool

MMDET_ANALYSIS_TOOLS = osp.join(osp.dirname(mmdet.__file__), '.mim', 'tools', 'analysis_tools')


def run_mmdet_tool(name, *args, cwd):
    result = subprocess.run([sys.executable, osp.join(MMDET_ANALYSIS_TOOLS, name), *args], capture_output=True,
                            text=True, timeout=600, cwd=cwd)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


@pytest.mark.slow
def test_mmdet_analysis_tools_run_on_our_config(shapes_root, trained_checkpoint, tmp_path):
    options = data_options(shapes_root, 1)
    run_tool('test.py', DEMO, trained_checkpoint, '--work-dir', str(tmp_path / 'test'),
             '--out', str(tmp_path / 'predictions.pkl'), '--cfg-options', *options)

    printed = run_mmdet_tool('get_flops.py', DEMO, '--num-images', '1', '--cfg-options', *options, cwd=tmp_path)
    assert 'Input shape: (128, 128)' in printed and 'Flops: ' in printed
    run_mmdet_tool('browse_dataset.py', DEMO, '--output-dir', 'browse', '--not-show', '--cfg-options', *options,
                   cwd=tmp_path)
    assert len(glob.glob(str(tmp_path / 'browse' / '*.png'))) == 16  # the shapes train images
    run_mmdet_tool('confusion_matrix.py', DEMO, 'predictions.pkl', 'confusion', '--cfg-options', *options,
                   cwd=tmp_path)
    assert (tmp_path / 'confusion' / 'confusion_matrix.png').is_file()
    run_mmdet_tool('analyze_results.py', DEMO, 'predictions.pkl', 'results', '--cfg-options', *options,
                   cwd=tmp_path)
    assert glob.glob(str(tmp_path / 'results' / 'good' / '*.png'))
    (log, ) = glob.glob(osp.join(osp.dirname(trained_checkpoint), '*', 'vis_data', '2*.json'))  # its training log
    run_mmdet_tool('analyze_logs.py', 'plot_curve', log, '--keys', 'loss', '--out', 'loss.png', cwd=tmp_path)
    assert (tmp_path / 'loss.png').is_file()
