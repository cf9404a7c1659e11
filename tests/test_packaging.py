import glob
import os
import os.path as osp
import shutil
import subprocess
import sys
import zipfile

from conftest import REPO_ROOT

# What a build must not read from, or write into, the checkout it copies
NOT_SOURCES = shutil.ignore_patterns('.git', '.venv', 'work_dirs', 'data', 'build', '*.egg-info', '__pycache__',
                                     '.pytest_cache')


def test_wheel_ships_the_package_and_its_configs(tmp_path):
    # setuptools writes build/ and condtok_mm.egg-info/ next to setup.py: build a copy, not the checkout
    checkout_before = sorted(os.listdir(REPO_ROOT))
    source = tmp_path / 'source'
    shutil.copytree(REPO_ROOT, source, symlinks=True, ignore=NOT_SOURCES)  # keeps condtok_mm/.mim/configs a link
    subprocess.run([sys.executable, '-m', 'pip', 'wheel', '-q', '--no-deps', '--no-build-isolation', str(source),
                    '-w', str(tmp_path / 'dist')], check=True, capture_output=True, cwd=tmp_path, timeout=300)
    assert sorted(os.listdir(REPO_ROOT)) == checkout_before
    (wheel, ) = glob.glob(str(tmp_path / 'dist' / 'condtok_mm-*.whl'))
    names = set(zipfile.ZipFile(wheel).namelist())
    configs = {osp.relpath(p, REPO_ROOT) for p in glob.glob(osp.join(REPO_ROOT, 'configs', '**', '*.py'),
                                                            recursive=True)}
    assert configs and {f'condtok_mm/.mim/{c}' for c in configs} <= names
    assert {'condtok_mm/conditioning.py', 'condtok_mm/models/backbones/cond_swin.py'} <= names
    assert not any(n.startswith(('tests/', 'tools/')) for n in names)
