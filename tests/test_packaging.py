import ast
import glob
import json
import os
import os.path as osp
import re
import subprocess
import sys
import sysconfig
import zipfile

from conftest import REPO_ROOT, build_wheel


def test_wheel_ships_the_package_and_its_configs(tmp_path):
    checkout_before = sorted(os.listdir(REPO_ROOT))
    wheel = build_wheel(tmp_path)
    assert sorted(os.listdir(REPO_ROOT)) == checkout_before  # built from a copy: no build/ or egg-info here
    names = set(zipfile.ZipFile(wheel).namelist())
    configs = {osp.relpath(p, REPO_ROOT) for p in glob.glob(osp.join(REPO_ROOT, 'configs', '**', '*.py'),
                                                            recursive=True)}
    assert configs and {f'condtok_mm/.mim/{c}' for c in configs} <= names
    assert {'condtok_mm/conditioning/__init__.py', 'condtok_mm/conditioning/batched.py',
            'condtok_mm/models/backbones/cond_swin.py'} <= names
    assert not any(n.startswith(('tests/', 'tools/')) for n in names)
    # what mim looks for: the model index with the metafiles it imports, and the tools
    assert {'condtok_mm/.mim/model-index.yml', 'condtok_mm/.mim/configs/swin/metafile.yml',
            'condtok_mm/.mim/tools/train.py', 'condtok_mm/.mim/tools/test.py',
            'condtok_mm/.mim/tools/analysis/plot_conditioning.py'} <= names
    (license_file, ) = [n for n in names if n.endswith('LICENSE')]  # dist-info/licenses/LICENSE
    assert zipfile.ZipFile(wheel).read(license_file) == open(osp.join(REPO_ROOT, 'LICENSE'), 'rb').read()


def test_the_license_file_is_the_license_setup_py_declares():
    assert declared('license') == 'Apache License 2.0'
    assert ' '.join(open(osp.join(REPO_ROOT, 'LICENSE')).read().split()[:4]) == 'Apache License Version 2.0,'


def declared(keyword):
    """The string value of ``keyword=...`` in setup.py's setup() call."""
    (call, ) = [node for node in ast.walk(ast.parse(open(osp.join(REPO_ROOT, 'setup.py')).read()))
                if isinstance(node, ast.Call) and getattr(node.func, 'id', None) == 'setup']
    (value, ) = [kw.value.value for kw in call.keywords if kw.arg == keyword]
    return value


def test_the_package_parses_on_the_oldest_python_that_setup_py_accepts():
    oldest = tuple(int(part) for part in re.fullmatch(r'>=(\d+)\.(\d+)', declared('python_requires')).groups())
    for path in glob.glob(osp.join(REPO_ROOT, 'condtok_mm', '**', '*.py'), recursive=True):
        ast.parse(open(path).read(), path, feature_version=oldest)  # SyntaxError names the file and line


def test_installing_into_an_environment_that_has_the_stack_moves_nothing(tmp_path):
    # A second virtual environment that sees this one's packages (torch, mmcv, mmengine, mmdet, ...), as a
    # user's mmdet or mmseg environment would: pip, offline, must find every requirement of condtok_mm and of
    # its extras satisfied there and install condtok_mm alone.
    venv = tmp_path / 'host'
    subprocess.run([sys.executable, '-m', 'venv', '--without-pip', str(venv)], check=True)
    (site_packages, ) = glob.glob(str(venv / 'lib' / 'python*' / 'site-packages'))
    with open(osp.join(site_packages, 'stack.pth'), 'w') as f:
        f.write(sysconfig.get_paths()['purelib'] + '\n')  # this environment's packages, after the host's own
    result = subprocess.run(
        [str(venv / 'bin' / 'python'), '-m', 'pip', 'install', '--dry-run', '--no-index', '--no-build-isolation',
         '--quiet', '--report', str(tmp_path / 'report.json'), f'{REPO_ROOT}[mmpretrain,coco,analysis,seg,tests]'],
        capture_output=True, text=True, cwd=tmp_path, env={**os.environ, 'PIP_CONSTRAINT': ''})
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.load(open(tmp_path / 'report.json'))
    to_install = [re.sub(r'[-_.]+', '-', item['metadata']['name']).lower() for item in report['install']]
    assert to_install == ['condtok-mm'], report['install']
