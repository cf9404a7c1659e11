"""The tests' fixtures (the shared datasets and the trained demo checkpoint) and pytest's hooks; the helpers the
tests share are in tests/helpers/."""
import os
import shutil

# One intra-op thread for each test process and the processes the tests start (a value set in the environment is
# kept): `make test` runs three pytest-xdist workers, and the end-to-end tests their training processes, on 2 cores,
# where the spinning OpenMP threads of oversubscribed processes made small linear-algebra tests up to 200x slower
# (tests/conditioning/test_token_graying.py at 64 x 512: 0.06 s alone, 15 s beside a second worker). Set before torch loads.
os.environ.setdefault('OMP_NUM_THREADS', '1')
os.environ.setdefault('MKL_NUM_THREADS', '1')

import pytest  # noqa: E402
import torch  # noqa: E402
from helpers.cfg_options import data_options  # noqa: E402
from helpers.repo import DEMO, run_tool  # noqa: E402


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
