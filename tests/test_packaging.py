import ast
import glob
import json
import os
import os.path as osp
import re
import runpy
import subprocess
import sys
import sysconfig
import zipfile

import pytest
import setuptools
from mmengine.config import Config

from helpers.repo import REPO_ROOT, build_wheel, load_install_script


@pytest.mark.slow
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
    # the code of the tools, which import it from the installed package
    assert {'condtok_mm/analysis/plot_conditioning.py', 'condtok_mm/analysis/training_dynamics/compare.py',
            'condtok_mm/benchmark/op_counts.py', 'condtok_mm/suites/run_suite.py',
            'condtok_mm/model_converters/publish_model.py'} <= names
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



def test_the_tools_rely_on_the_installed_package():
    # a tool that put its checkout on sys.path would run that checkout's code whatever is installed, and one that
    # put its own folder there would import its siblings as top-level modules that the tests cannot import
    edits = [f'{osp.relpath(path, REPO_ROOT)}:{number}' for path in glob.glob(osp.join(REPO_ROOT, 'tools', '**', '*'),
                                                                              recursive=True) if osp.isfile(path)
             for number, line in enumerate(open(path, errors='replace'), 1) if 'sys.path' in line]
    assert edits == []


@pytest.fixture
def setup_call(monkeypatch):
    """The keyword arguments setup.py passes to setuptools.setup, setup.py run as pip runs it."""
    call = {}
    monkeypatch.setattr(setuptools, 'setup', lambda **kwargs: call.update(kwargs))
    runpy.run_path(osp.join(REPO_ROOT, 'setup.py'))
    return call


def test_tensorboard_is_an_extra_and_not_a_requirement(setup_call):
    names = [re.split(r'[<>=!~;\[ ]', requirement)[0].lower() for requirement in setup_call['install_requires']]
    assert 'tensorboard' not in names
    assert setup_call['extras_require']['tensorboard'] == ['tensorboard']


def test_make_install_installs_every_extra():
    # the demo and the tests need the extras (the demo configs log to TensorBoard); install.sh installs each
    # extra's requirements file, setup.py reads them by name
    setup_py, install_sh = (open(osp.join(REPO_ROOT, path)).read() for path in ('setup.py', 'tools/install.sh'))
    extra_files = re.findall(r"'\w+': read_requirements\('(requirements/\w+\.txt)'\)", setup_py)
    assert 'requirements/tensorboard.txt' in extra_files
    assert [path for path in extra_files if f'-r {path}' not in install_sh] == []


def test_setuptools_that_still_has_pkg_resources_is_a_requirement(setup_call):
    assert 'setuptools<81' in setup_call['install_requires']


def test_a_mmdet_config_base_needs_pkg_resources(monkeypatch):
    # why setuptools<81 is declared: mmengine finds a `mmdet::` base through pkg_resources (gone in setuptools 81)
    config = osp.join(REPO_ROOT, 'configs', 'swin', 'mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py')
    monkeypatch.setitem(sys.modules, 'pkg_resources', None)
    with pytest.raises(ImportError, match='pkg_resources'):
        Config.fromfile(config)
    monkeypatch.undo()
    assert Config.fromfile(config).model.type == 'MaskRCNN'

@pytest.mark.slow
def test_installing_into_an_environment_that_has_the_stack_moves_nothing(tmp_path, setup_call):
    # A second virtual environment that sees this one's packages (torch, mmcv, mmengine, mmdet, ...), as a
    # user's mmdet or mmseg environment would: pip, offline, must find every requirement of condtok_mm and of
    # its extras satisfied there and install condtok_mm alone.
    extras = ','.join(setup_call['extras_require'])
    venv = tmp_path / 'host'
    subprocess.run([sys.executable, '-m', 'venv', '--without-pip', str(venv)], check=True)
    (site_packages, ) = glob.glob(str(venv / 'lib' / 'python*' / 'site-packages'))
    with open(osp.join(site_packages, 'stack.pth'), 'w') as f:
        f.write(sysconfig.get_paths()['purelib'] + '\n')  # this environment's packages, after the host's own
    result = subprocess.run(
        [str(venv / 'bin' / 'python'), '-m', 'pip', 'install', '--dry-run', '--no-index', '--no-build-isolation',
         '--quiet', '--report', str(tmp_path / 'report.json'), f'{REPO_ROOT}[{extras}]'],
        capture_output=True, text=True, cwd=tmp_path, env={**os.environ, 'PIP_CONSTRAINT': ''})
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.load(open(tmp_path / 'report.json'))
    to_install = [re.sub(r'[-_.]+', '-', item['metadata']['name']).lower() for item in report['install']]
    assert to_install == ['condtok-mm'], report['install']


mmcv_build = load_install_script('mmcv_build.py')
H200 = dict(capabilities=[(9, 0)], device_names=['NVIDIA H200'])
TOOLKIT = dict(cuda_home='/opt/cuda-13.0', nvcc_release='13.0', cuda_headers=True)


@pytest.mark.parametrize('machine, expected', [
    (dict(torch_cuda='13.0', **H200, **TOOLKIT), ('1', '9.0', '/opt/cuda-13.0', 'cu13.0-sm90')),
    # every visible architecture once, sorted; nvcc's minor release may differ from torch's (cpp_extension warns)
    (dict(torch_cuda='13.0', capabilities=[(9, 0), (8, 6), (9, 0)], device_names=['a', 'b', 'c'],
          **dict(TOOLKIT, nvcc_release='13.1')), ('1', '8.6;9.0', '/opt/cuda-13.0', 'cu13.1-sm86-sm90')),
    # a TORCH_CUDA_ARCH_LIST the user set wins over the visible GPU
    (dict(torch_cuda='13.0', arch_list='8.0 9.0+PTX', **H200, **TOOLKIT), ('1', '8.0;9.0+PTX', '/opt/cuda-13.0',
                                                                          'cu13.0-sm80-sm90ptx')),
    # a build host without a GPU: FORCE_CUDA=1 and the target architectures
    (dict(torch_cuda='13.0', force_cuda='1', arch_list='9.0', **TOOLKIT),
     ('1', '9.0', '/opt/cuda-13.0', 'cu13.0-sm90')),
    # CPU ops: no GPU (nvcc or not), a CPU-only torch, or FORCE_CUDA=0 whatever the machine has
    (dict(torch_cuda='13.0', **TOOLKIT), ('0', '', '', 'cpu')),
    (dict(torch_cuda='13.0'), ('0', '', '', 'cpu')),
    (dict(torch_cuda=None), ('0', '', '', 'cpu')),
    (dict(torch_cuda='13.0', force_cuda='0', **H200), ('0', '', '', 'cpu')),
    (dict(torch_cuda='13.0', force_cuda='', **TOOLKIT), ('0', '', '', 'cpu')),
], ids=['h200', 'mixed-gpus', 'user-arch-list', 'force-cuda-no-gpu', 'no-gpu', 'no-gpu-no-nvcc', 'cpu-torch',
        'force-cpu', 'empty-force-cuda'])
def test_mmcv_build_is_cuda_for_the_visible_architectures_where_there_is_a_gpu_and_nvcc(machine, expected):
    build = mmcv_build.choose_build(mmcv_build.Machine(**machine))
    assert (build.force_cuda, build.arch_list, build.cuda_home, build.tag) == expected


@pytest.mark.parametrize('machine, message', [
    (dict(torch_cuda='13.0', **H200), r'torch sees NVIDIA H200 but .*nvcc: no nvcc on PATH, CUDA_HOME unset.*'
                                      r'Install the CUDA 13\.0 toolkit.*set CUDA_HOME.*FORCE_CUDA=0 make install'),
    (dict(torch_cuda='13.0', **H200, cuda_home='/usr/local'), r'/usr/local/bin/nvcc does not exist.*CUDA 13\.0 '),
    (dict(torch_cuda='13.0', **H200, **dict(TOOLKIT, cuda_headers=False)), r'no include/cuda_runtime\.h.*CUDA_HOME'),
    (dict(torch_cuda='13.0', **H200, **dict(TOOLKIT, nvcc_release='12.8')),
     r'nvcc at /opt/cuda-13\.0 is CUDA 12\.8 but torch was built with CUDA 13\.0.*install the CUDA 13\.0 toolkit'),
    (dict(torch_cuda='13.0', force_cuda='1', **TOOLKIT), r'FORCE_CUDA=1 without a visible GPU: set TORCH_CUDA_ARCH'),
    (dict(torch_cuda='13.0', arch_list='sm_90', **H200, **TOOLKIT), r"TORCH_CUDA_ARCH_LIST='sm_90' is not a list"),
    (dict(torch_cuda=None, force_cuda='1'), r'FORCE_CUDA=1 but this torch is a CPU-only build'),
    (dict(torch_cuda='13.0', force_cuda='yes', **H200, **TOOLKIT), r"FORCE_CUDA='yes': set it to 1"),
], ids=['no-nvcc', 'no-nvcc-in-cuda-home', 'no-headers', 'nvcc-major-mismatch', 'force-cuda-no-arch', 'bad-arch',
        'force-cuda-cpu-torch', 'bad-force-cuda'])
def test_mmcv_build_stops_naming_the_fix_where_a_cuda_build_cannot_work(machine, message):
    with pytest.raises(mmcv_build.BuildError, match=message):
        mmcv_build.choose_build(mmcv_build.Machine(**machine))


def fake_toolkit(root, release):
    """A CUDA_HOME whose bin/nvcc reports ``release`` and which has the CUDA runtime header."""
    os.makedirs(root / 'bin')
    os.makedirs(root / 'include')
    (root / 'include' / 'cuda_runtime.h').write_text('')
    nvcc = root / 'bin' / 'nvcc'
    nvcc.write_text(f'#!/bin/sh\necho "Cuda compilation tools, release {release}, V{release}.0"\n')
    nvcc.chmod(0o755)
    return str(root)


def run_mmcv_build(*args, **env):
    return subprocess.run([sys.executable, osp.join(REPO_ROOT, 'tools', 'mmcv_build.py'), *args],
                          capture_output=True, text=True, timeout=120, env={**os.environ, **env})


@pytest.mark.slow
def test_mmcv_build_choose_reads_this_machine_and_prints_what_install_sh_parses(tmp_path):
    import torch
    visible = torch.cuda.device_count()
    result = run_mmcv_build('choose', CUDA_HOME=fake_toolkit(tmp_path / 'cuda', torch.version.cuda or '13.0'),
                            FORCE_CUDA='1', TORCH_CUDA_ARCH_LIST='' if visible else '7.5')
    if torch.version.cuda is None:
        assert result.returncode == 1 and 'CPU-only build' in result.stderr
        return
    assert result.returncode == 0, result.stderr
    arch = ';'.join(sorted({'%d.%d' % torch.cuda.get_device_capability(i) for i in range(visible)})) or '7.5'
    assert result.stdout.splitlines() == [
        'FORCE_CUDA=1', f'TORCH_CUDA_ARCH_LIST={arch}', f'CUDA_HOME={tmp_path / "cuda"}',
        f'MMCV_BUILD_TAG=cu{torch.version.cuda}-' + '-'.join('sm' + a.replace('.', '') for a in arch.split(';'))]
    assert f'[install] mmcv build: CUDA ops for {arch}' in result.stderr


def test_mmcv_build_check_runs_the_compiled_ops_and_a_cuda_tag_needs_cuda_ops():
    from mmcv.ops import get_compiling_cuda_version
    assert mmcv_build.check_ops('cpu') == 'nms and RoIAlign on the CPU'
    if get_compiling_cuda_version() == 'not available':
        with pytest.raises(AssertionError, match='mmcv was compiled without CUDA ops but this machine.s build is cu'):
            mmcv_build.check_ops('cu13.0-sm90')
    else:
        assert ' on the CPU and on ' in mmcv_build.check_ops('cu13.0-sm90')


@pytest.mark.slow  # three runs of install.sh, each starting python with torch (about 30 s)
def test_install_sh_keys_its_stamp_by_the_mmcv_build_and_stops_on_a_build_error(tmp_path):
    # A venv whose python is this one and whose stamp is what install.sh writes for a CPU build: install.sh
    # takes the already-installed exit. Forcing a CUDA build changes the tag, so the same stamp no longer
    # matches (nor does the CPU-only mmcv pass the CUDA check) and it goes on to install (stopped at once here
    # by PYTHON=/bin/false: no pip runs).
    venv = tmp_path / 'venv'
    os.makedirs(venv / 'bin')
    (venv / 'bin' / 'python').write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    (venv / 'bin' / 'python').chmod(0o755)
    install = osp.join(REPO_ROOT, 'tools', 'install.sh')
    stamp_function = re.search(r'^stamp_value\(\) \{.*?^\}', open(install).read(), re.S | re.M).group(0)
    stamps = {tag: subprocess.run(['bash', '-c', f'{stamp_function}\nMMCV_BUILD_TAG={tag}; stamp_value'],
                                  cwd=REPO_ROOT, capture_output=True, text=True, check=True).stdout
              for tag in ('cpu', 'cu13.0-sm90', 'cu13.0-sm80')}
    assert len(set(stamps.values())) == 3  # another build is another install, even where its check would pass
    (venv / '.condtok_mm-install').write_text(stamps['cpu'])

    def install_sh(**env):
        return subprocess.run(['bash', install], capture_output=True, text=True, timeout=300, env={
            **os.environ, 'VENV': str(venv), 'PYTHON': '/bin/false', 'CUDA_VISIBLE_DEVICES': '', **env})

    result = install_sh(FORCE_CUDA='0')
    assert result.returncode == 0 and 'already installed' in result.stdout and 'mmcv build cpu' in result.stdout, (
        result.stdout + result.stderr)
    toolkit = fake_toolkit(tmp_path / 'cuda', '13.0')
    result = install_sh(FORCE_CUDA='1', TORCH_CUDA_ARCH_LIST='9.0', CUDA_HOME=toolkit)
    assert result.returncode == 1 and 'already installed' not in result.stdout
    assert 'mmcv build: CUDA ops for 9.0' in result.stderr and 'verified on Python 3.11' in result.stderr
    result = install_sh(FORCE_CUDA='1', CUDA_HOME=toolkit)  # no GPU visible, no architecture given
    assert result.returncode == 1 and '[install] ERROR: FORCE_CUDA=1 without a visible GPU' in result.stderr
