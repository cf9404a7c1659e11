import argparse
import glob
import math
import os
import os.path as osp
import shutil
import queue
import re
import socket
import subprocess
import sys
import threading
import time

# One intra-op thread for each test process and the processes the tests start (a value set in the environment is
# kept): `make test` runs three pytest-xdist workers, and the end-to-end tests their training processes, on 2 cores,
# where the spinning OpenMP threads of oversubscribed processes made small linear-algebra tests up to 200x slower
# (tests/test_token_graying.py at 64 x 512: 0.06 s alone, 15 s beside a second worker). Set before torch loads.
os.environ.setdefault('OMP_NUM_THREADS', '1')
os.environ.setdefault('MKL_NUM_THREADS', '1')

import pytest  # noqa: E402
import torch  # noqa: E402
from mmengine.config import DictAction

REPO_ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
DEMO = osp.join(REPO_ROOT, 'configs', 'demo', 'mask-rcnn_swin-mini-condtok_fpn_12e_shapes.py')


def pytest_configure(config):
    """Parse each installed package's metafiles once per test process instead of once per `mmdet::` base.

    mmengine 0.10.7 (mmengine/config/utils.py:50, `_get_cfg_metainfo`) reads model-index.yml and all 102
    metafile.yml of mmdet (~0.7 s) every time a config names an `mmdet::` base, and the tests load over a hundred
    such configs. The installed packages do not change during a test run and `_get_cfg_metainfo` only reads what
    it loads, so the module's `load` is memoized by path for those YAML files.
    """
    import functools

    import mmengine.config.utils as config_utils
    if getattr(config_utils.load, 'memoized_for_tests', False):
        return
    read_yaml = functools.lru_cache(maxsize=None)(config_utils.load)

    def load(file, *args, **kwargs):
        if isinstance(file, str) and file.endswith('.yml') and not args and not kwargs:
            return read_yaml(file)
        return read_yaml.__wrapped__(file, *args, **kwargs)

    load.memoized_for_tests = True
    config_utils.load = load


def pytest_collection_modifyitems(config, items):
    """Tests marked `gpu` are skipped, with one reason, where torch sees no CUDA device."""
    if torch.cuda.is_available():
        return
    no_cuda = pytest.mark.skip(reason='gpu: needs a CUDA device; torch.cuda.is_available() is False here')
    for item in items:
        if 'gpu' in item.keywords:
            item.add_marker(no_cuda)


# The first-stage token matrices of Swin-T (3136 x 96) and ViT-B (196 x 768): seconds each on 2 cores, so a test
# parametrized over them runs them in `make test` and its smaller shapes in `make test-quick`.
STAGE_SHAPES = [pytest.param((3136, 96), marks=pytest.mark.slow), pytest.param((196, 768), marks=pytest.mark.slow)]


def random_tokens(batch, n, d, kappa, dtype=torch.float32, seed=0):
    """(B, N, d) matrices with singular values log-spaced from 3 down to 3 / kappa."""
    gen = torch.Generator().manual_seed(seed)
    r = min(n, d)
    mats = []
    for _ in range(batch):
        u, _ = torch.linalg.qr(torch.randn(n, r, dtype=torch.float64, generator=gen))
        v, _ = torch.linalg.qr(torch.randn(d, r, dtype=torch.float64, generator=gen))
        s = 3 * torch.logspace(0, -math.log10(kappa), r, dtype=torch.float64)
        mats.append((u * s) @ v.T)
    return torch.stack(mats).to(dtype)


def window_matrices(grid, window_size):
    """{(top, left): (B, tokens, C)} of every window_size x window_size tile of a (B, H, W, C) token grid,
    from the top-left corner; tiles cut by the bottom/right border keep only their real tokens."""
    b, h, w, c = grid.shape
    return {(top, left): grid[:, top:top + window_size, left:left + window_size].reshape(b, -1, c)
            for top in range(0, h, window_size) for left in range(0, w, window_size)}


def made_once(tmp_path_factory, name, make):
    """The folder ``name`` filled by ``make(folder)`` once per test run, shared by the pytest-xdist workers.

    Each worker has its own base temp folder; their parent is the run's, so the first worker to need the folder
    makes it there under a file lock and the others wait for it and reuse it. A ``done`` mark is written last, so
    a folder left half-made by a crashed worker is made again.
    """
    import filelock  # a dependency of torch
    root = tmp_path_factory.getbasetemp()
    if os.environ.get('PYTEST_XDIST_WORKER'):
        root = root.parent
    folder = root / name
    with filelock.FileLock(str(folder) + '.lock'):
        if not (folder / 'done').is_file():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            make(folder)
            (folder / 'done').touch()
    return folder


@pytest.fixture(scope='session')
def shapes_root(tmp_path_factory):
    """A small shapes dataset written once per test run."""
    from condtok_mm.datasets import make_shapes_dataset

    def make(folder):
        make_shapes_dataset(str(folder), num_train=16, num_val=8, image_size=(96, 96), seed=3)

    return str(made_once(tmp_path_factory, 'shapes', make))


@pytest.fixture(scope='session')
def small_shapes(tmp_path_factory):
    """The suite runner's end-to-end cells' dataset, smaller than :func:`shapes_root`: 8 training images (2
    iterations an epoch at 4 a batch) and 4 validation images, 64 x 64; most of a cell's time is starting its two
    processes."""
    from condtok_mm.datasets import make_shapes_dataset

    def make(folder):
        make_shapes_dataset(str(folder), num_train=8, num_val=4, image_size=(64, 64), seed=3)

    return str(made_once(tmp_path_factory, 'small_shapes', make))


def load_script(*path):
    """The script tools/PATH... (tools/ is not a package) loaded as a module named after its file."""
    import importlib.util
    script = osp.join(REPO_ROOT, 'tools', *path)
    spec = importlib.util.spec_from_file_location(osp.splitext(osp.basename(script))[0], script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_main(main, script, *args):
    """``main(list(args))``, the entry point of ``script``, run in this process as ``python SCRIPT ARGS`` would
    run it: its exit status, stdout and stderr as subprocess.run returns them, the exit handled as the interpreter
    does (``sys.exit(MESSAGE)`` prints MESSAGE to stderr and exits with 1; any other exception fails the test with
    its traceback). A process of its own would spend ~7 s importing torch, mmdet and condtok_mm, which this one
    has."""
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


def process_tree(pid):
    """``pid`` and every process descended from it, from /proc (Linux)."""
    children = {}
    for entry in filter(str.isdigit, os.listdir('/proc')):
        try:
            with open(f'/proc/{entry}/stat') as f:
                parent = int(f.read().rsplit(')', 1)[1].split()[1])
        except (OSError, IndexError, ValueError):  # ended meanwhile
            continue
        children.setdefault(parent, []).append(int(entry))
    tree, pending = [], [pid]
    while pending:
        tree.append(pending.pop())
        pending.extend(children.get(tree[-1], []))
    return tree


def process_state(pid):
    """The state of process ``pid`` in /proc/PID/stat (R running, S sleeping, T stopped, Z a zombie: exited, not
    reaped yet), None once it is gone."""
    try:
        with open(f'/proc/{pid}/stat') as f:
            return f.read().rsplit(')', 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def alive(pid):
    """Whether process ``pid`` runs (a zombie does not)."""
    return process_state(pid) not in (None, 'Z')


def free_port():
    """A TCP port on 127.0.0.1 that no one listens on now (the OS picks it), so that parallel runs differ."""
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


def data_options(root, max_epochs):
    """--cfg-options that point the demo config at a shapes dataset and make a short, quiet CPU run."""
    ann = osp.join(root, 'annotations', 'instances_{}.json')
    return [
        f'train_dataloader.dataset.data_root={root}/', f'val_dataloader.dataset.data_root={root}/',
        f'test_dataloader.dataset.data_root={root}/', f'val_evaluator.ann_file={ann.format("val")}',
        f'test_evaluator.ann_file={ann.format("val")}', f'train_cfg.max_epochs={max_epochs}',
        f'train_cfg.val_interval={max_epochs}', 'train_dataloader.num_workers=0',
        'train_dataloader.persistent_workers=False', 'val_dataloader.num_workers=0',
        'val_dataloader.persistent_workers=False', 'test_dataloader.num_workers=0',
        'test_dataloader.persistent_workers=False', 'default_hooks.checkpoint.interval=1',
        'default_hooks.logger.interval=1', 'randomness.seed=0'
    ]


def cfg_options_dict(options):
    """--cfg-options strings as the dict the tools merge into the config (parsed as by DictAction)."""
    parser = argparse.ArgumentParser()
    parser.add_argument('--cfg-options', nargs='+', action=DictAction)
    return parser.parse_args(['--cfg-options', *options]).cfg_options


def run_tool(tool, *args, env=None):
    """Run tools/<tool> (a Python script, or a shell script with bash) and return its output (the log)."""
    path = osp.join(REPO_ROOT, 'tools', tool)
    command = ['bash', path] if tool.endswith('.sh') else [sys.executable, path]
    result = subprocess.run([*command, *args], capture_output=True, text=True, timeout=900, cwd=REPO_ROOT,
                            env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout + result.stderr


def _forward_lines(stream, lines):
    for line in stream:
        lines.put(line)
    lines.put(None)  # end of output


def read_until(process, pattern, timeout):
    """The lines ``process`` writes to its stdout (a text pipe) up to the first that matches ``pattern``.

    A process that exits first, or does not print such a line within ``timeout`` seconds, is killed and
    fails the test with the end of its output: a read loop must not hang the suite.
    """
    lines = queue.Queue()
    threading.Thread(target=_forward_lines, args=(process.stdout, lines), daemon=True).start()
    deadline = time.monotonic() + timeout
    log = []
    while True:
        try:
            line = lines.get(timeout=max(deadline - time.monotonic(), 0))
        except queue.Empty:
            process.kill()
            pytest.fail(f'no line matching {pattern!r} within {timeout} s; last output:\n' + ''.join(log[-50:]))
        if line is None:
            process.wait()
            pytest.fail(f'the process exited ({process.returncode}) before a line matching {pattern!r}; last '
                        'output:\n' + ''.join(log[-50:]))
        log.append(line)
        if re.search(pattern, line):
            return log


@pytest.fixture(scope='session')
def trained_checkpoint(shapes_root, tmp_path_factory):
    """A demo model trained on the 8 val images until its COCO AP is clearly above 0 (40 iterations), so that
    the tests that compare AP compare something."""
    def train(work_dir):
        run_tool('train.py', DEMO, '--work-dir', str(work_dir), '--cfg-options', *data_options(shapes_root, 20),
                 'train_dataloader.dataset.ann_file=annotations/instances_val.json',
                 'train_dataloader.dataset.data_prefix.img=val/', 'param_scheduler=[]',
                 'optim_wrapper.optimizer.lr=0.002', 'default_hooks.checkpoint.interval=20')

    return str(made_once(tmp_path_factory, 'trained', train) / 'epoch_20.pth')


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
