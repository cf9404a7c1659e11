import glob
import os.path as osp
import subprocess
import sys
import zipfile

from conftest import REPO_ROOT


def test_wheel_ships_the_package_and_its_configs(tmp_path):
    subprocess.run([sys.executable, '-m', 'pip', 'wheel', '-q', '--no-deps', '--no-build-isolation',
                    REPO_ROOT, '-w', str(tmp_path)], check=True, capture_output=True, cwd=tmp_path)
    (wheel, ) = glob.glob(str(tmp_path / 'condtok_mm-*.whl'))
    names = set(zipfile.ZipFile(wheel).namelist())
    configs = {osp.relpath(p, REPO_ROOT) for p in glob.glob(osp.join(REPO_ROOT, 'configs', '**', '*.py'),
                                                            recursive=True)}
    assert configs and {f'condtok_mm/.mim/{c}' for c in configs} <= names
    assert {'condtok_mm/conditioning.py', 'condtok_mm/models/backbones/cond_swin.py'} <= names
    assert not any(n.startswith(('tests/', 'tools/')) for n in names)
