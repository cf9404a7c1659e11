"""mim (openmim) with condtok_mm installed from its wheel, as a user's environment has it: `mim search`, `mim train`,
`mim test` and `mim run` find our model index, configs and tools in condtok_mm/.mim."""
import glob
import os
import re
import subprocess
import sys
import sysconfig

import pytest

from helpers.cfg_options import data_options
from helpers.repo import build_wheel

DEMO_NAME = 'mask-rcnn_swin-mini-condtok_fpn_12e_shapes.py'  # found in the installed package's .mim/configs


@pytest.fixture(scope='module')
def host(tmp_path_factory):
    """A virtual environment that sees this one's packages (torch, mmdet, openmim, ...) and has condtok_mm
    installed from its wheel, not from this checkout."""
    root = tmp_path_factory.mktemp('mim')
    wheel = build_wheel(root)
    subprocess.run([sys.executable, '-m', 'venv', '--without-pip', str(root / 'host')], check=True)
    (site_packages, ) = glob.glob(str(root / 'host' / 'lib' / 'python*' / 'site-packages'))
    with open(os.path.join(site_packages, 'stack.pth'), 'w') as f:
        f.write(sysconfig.get_paths()['purelib'] + '\n')
    python = str(root / 'host' / 'bin' / 'python')
    # --ignore-installed: leave this environment's condtok_mm (seen through stack.pth) alone
    subprocess.run([python, '-m', 'pip', 'install', '-q', '--no-deps', '--ignore-installed', '--no-index', wheel],
                   check=True, capture_output=True)
    return python, root


def mim(host, *args):
    python, root = host
    env = {name: value for name, value in os.environ.items() if name != 'PYTHONPATH'}  # the wheel, not a checkout
    result = subprocess.run([python, '-m', 'mim', *args], capture_output=True, text=True, timeout=600, cwd=root,
                            env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout + result.stderr


@pytest.mark.slow
def test_mim_search_lists_our_configs_with_attributed_results(host):
    printed = mim(host, 'search', 'condtok_mm')
    assert 'config id: mask-rcnn_condtok' in printed and 'config id: mask-rcnn_swin-t-p4-w7-condtok_fpn_1x_coco' \
        in printed
    assert re.search(r'coco/box_ap_\(paper\) +46.2', printed)  # XCiT-M24 conditioned, the paper's number


@pytest.mark.slow
def test_mim_train_test_and_run_use_our_tools(host, shapes_root):
    options = [*data_options(shapes_root, 1), 'train_dataloader.dataset.indices=4']  # 1 iteration
    printed = mim(host, 'train', 'condtok_mm', DEMO_NAME, '--work-dir', 'work', '--cfg-options', *options)
    assert '/condtok_mm/.mim/tools/train.py' in printed and 'Training finished successfully' in printed
    _, root = host
    assert (root / 'work' / 'epoch_1.pth').is_file()

    printed = mim(host, 'test', 'condtok_mm', DEMO_NAME, '--checkpoint', 'work/epoch_1.pth', '--work-dir',
                  'test', '--cfg-options', *options)
    assert 'Testing finished successfully' in printed

    printed = mim(host, 'run', 'condtok_mm', 'plot_conditioning', 'work', '--out', 'kappa.png')
    assert re.search(r'tokens_out_mean stage0 +2 ', printed)  # conditioned: kappa 2
    assert (root / 'kappa.png').is_file()


@pytest.mark.slow
def test_mim_search_finds_our_model_index_in_the_make_install_environment(tmp_path):
    """The environment tools/install.sh makes (an editable install of this checkout), from a folder outside it."""
    env = {name: value for name, value in os.environ.items() if name != 'PYTHONPATH'}
    result = subprocess.run([sys.executable, '-m', 'mim', 'search', 'condtok_mm'], capture_output=True, text=True,
                            timeout=600, cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert 'config id: mask-rcnn_condtok' in result.stdout
