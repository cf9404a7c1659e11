"""The checkout the tests run in: its root, the demo config, its tools' entry points run in this process or its
tools in a process of their own, and its wheel."""
import glob
import os.path as osp
import shutil
import subprocess
import sys

REPO_ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
DEMO = osp.join(REPO_ROOT, 'configs', 'demo', 'mask-rcnn_swin-mini-condtok_fpn_12e_shapes.py')


def load_install_script(name):
    """tools/NAME loaded as a module named after its file: for the scripts that tools/install.sh runs before
    condtok_mm and the OpenMMLab stack are installed, which therefore cannot live in the package (the other tools'
    code is condtok_mm's, which the tests import)."""
    import importlib.util
    script = osp.join(REPO_ROOT, 'tools', name)
    spec = importlib.util.spec_from_file_location(osp.splitext(osp.basename(script))[0], script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_main(main, script, *args):
    """``main(list(args))``, the entry point of the tool ``script``, run in this process as ``python SCRIPT ARGS``
    would run it: its exit status, stdout and stderr as subprocess.run returns them, the exit handled as the
    interpreter does (``sys.exit(MESSAGE)`` prints MESSAGE to stderr and exits with 1; any other exception fails
    the test with its traceback). A process of its own would spend ~7 s importing torch, mmdet and condtok_mm, which
    this one has."""
    import contextlib
    import io
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            main(list(args))
            returncode = 0
        except SystemExit as exit:
            if exit.code is None or isinstance(exit.code, int):
                returncode = exit.code or 0
            else:
                print(exit.code, file=sys.stderr)
                returncode = 1
    return subprocess.CompletedProcess([sys.executable, script, *args], returncode, stdout.getvalue(),
                                       stderr.getvalue())


def run_tool(tool, *args, env=None):
    """Run tools/<tool> (a Python script, or a shell script with bash) and return its output (the log)."""
    path = osp.join(REPO_ROOT, 'tools', tool)
    command = ['bash', path] if tool.endswith('.sh') else [sys.executable, path]
    result = subprocess.run([*command, *args], capture_output=True, text=True, timeout=900, cwd=REPO_ROOT,
                            env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout + result.stderr


def build_wheel(out_dir):
    """The path of condtok_mm's wheel, built from a clean copy of this checkout: setuptools builds in build/
    inside the source tree and would ship files left there by an earlier build."""
    source = osp.join(str(out_dir), 'source')
    shutil.copytree(REPO_ROOT, source, symlinks=True, ignore=shutil.ignore_patterns(
        '.git', '.venv', 'build', 'work_dirs', 'data', '*.egg-info', '__pycache__', '.pytest_cache'))
    subprocess.run([sys.executable, '-m', 'pip', 'wheel', '-q', '--no-deps', '--no-build-isolation', source, '-w',
                    str(out_dir)], check=True, capture_output=True, cwd=str(out_dir))
    (wheel, ) = glob.glob(osp.join(str(out_dir), 'condtok_mm-*.whl'))
    return wheel
