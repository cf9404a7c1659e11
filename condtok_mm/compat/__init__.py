"""Run-time fixes for bugs of the installed OpenMMLab stack (mmengine <= 0.10.7 with torch >= 2.6). Opt-in.

Importing condtok_mm changes nothing outside its registries. These fixes change mmengine's behaviour for the
whole process, so they apply only when asked for, in one of two ways:

- ``condtok_mm.compat.apply()`` in Python (our ``tools/train.py``, ``tools/test.py`` and analysis tools call it);
- ``custom_imports = dict(imports=['condtok_mm', 'condtok_mm.compat.enable'])`` in a config (our configs do;
  importing :mod:`condtok_mm.compat.enable` calls ``apply()``).

Each fix says which upstream bug it covers, edits no installed file, and applies only where the installed
version has the bug (:data:`FIXES`, ``needed``): every one of them is in mmengine 0.10.7, the newest mmengine
release when this was written, so each applies to mmengine <= 0.10.7 and is skipped, with a log line, on a
newer one. The checkpoint loader also needs torch >= 2.6 (``weights_only`` checks with allow-lists).

- Checkpoint loading: torch >= 2.6 refuses mmengine's checkpoints (``weights_only``); they load with torch's
  weights-only unpickler and an allow-list of exactly the types they hold, so that no checkpoint runs code.
- Distributed runs without a GPU (``torchrun``/``srun`` on CPU machines): mmengine's launchers select a CUDA
  device, default to NCCL and pass ``device_ids`` to DDP. These fixes act only when no GPU is available
  (``mmengine.device.get_device() == 'cpu'``); on GPU machines mmengine's code runs unchanged.
- ``--auto-scale-lr``: the ``base_lr`` that the log reports is scaled with the learning rates.
- Interruption safety: checkpoints and ``last_checkpoint`` are written to a temporary file and renamed, and a
  checkpoint carries each process's random generator states so that ``--resume`` continues the same random
  streams as the run that was interrupted.
"""
import logging
import os
import os.path as osp
import pickle
import random
import re
import subprocess
import sys
from typing import Callable, NamedTuple, Set, Tuple

import mmengine
import numpy as np
import torch
import torch.distributed as torch_dist
from mmengine.device import get_device
from mmengine.dist import all_gather_object, get_dist_info, is_distributed, is_main_process
from mmengine.dist import utils as dist_utils
from mmengine.fileio import LocalBackend, get_file_backend
from mmengine.hooks import CheckpointHook
from mmengine.logging import HistoryBuffer, print_log
from mmengine.model import is_model_wrapper
from mmengine.optim import OptimWrapperDict
from mmengine.registry import MODEL_WRAPPERS
from mmengine.runner import Runner, ValLoop
from mmengine.runner import checkpoint as checkpoint_module
from mmengine.runner.checkpoint import CheckpointLoader
from mmengine.utils import digit_version
from torch.nn.parallel import DistributedDataParallel

# Where a checkpoint keeps the random generator states of the processes that saved it (a list, one entry per
# rank), inside the message hub's runtime information that mmengine saves and resumes.
RANDOM_STATES_KEY = 'condtok_mm_random_states'

_upstream_init_dist_pytorch = dist_utils._init_dist_pytorch
_upstream_init_dist_slurm = dist_utils._init_dist_slurm
_upstream_wrap_model = Runner.wrap_model
_upstream_scale_lr = Runner.scale_lr
_upstream_save_checkpoint = checkpoint_module.save_checkpoint
_upstream_runner_save_checkpoint = Runner.save_checkpoint
_upstream_resume = Runner.resume
_upstream_val_loop_run = ValLoop.run


# ----------------------------------------------------------------------------------------------------------
# Checkpoint loading
# ----------------------------------------------------------------------------------------------------------
class UnsafeCheckpointError(pickle.UnpicklingError):
    """A checkpoint holds objects of types outside :func:`checkpoint_safe_globals`: loading it could run code."""


# HistoryBuffer's default statistics methods (mmengine 0.10.7 HistoryBuffer._set_default_statistics), which every
# HistoryBuffer pickles by reference in its state.
HISTORY_BUFFER_STATISTICS = ('min', 'max', 'current', 'mean')


# Numeric numpy types, whose arrays and scalars a checkpoint may hold (HistoryBuffer's history is float64 and its
# counts int64, numpy's random state uint32; a logged value can be any numpy number).
NUMPY_NUMBER_TYPES = (np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
                      np.float16, np.float32, np.float64)


def _history_buffer_statistic(owner, name: str):
    """``getattr`` as HistoryBuffer pickles use it, and for nothing else.

    Pickle (protocol 2, torch.save's) writes the method ``HistoryBuffer.min`` as ``getattr(HistoryBuffer,
    'min')``. Allowing the real getattr would let a pickle reach any attribute of any object it has built
    (a function's ``__globals__``, a class's registries) and change it.
    """
    if owner is HistoryBuffer and name in HISTORY_BUFFER_STATISTICS:
        return getattr(owner, name)
    raise pickle.UnpicklingError(f'getattr({owner!r}, {name!r})')  # no HistoryBuffer statistics method


def checkpoint_safe_globals() -> list:
    """The types, besides tensors and Python's built-in containers and numbers, that mmengine checkpoints hold.

    Exactly these: a checkpoint of weights and training state needs nothing else, and any other class or
    function in a pickle could run code while it is loaded.
    """
    multiarray = np._core.multiarray if hasattr(np, '_core') else np.core.multiarray  # numpy 2 / numpy 1
    return [
        HistoryBuffer,  # message_hub.log_scalars: the logged losses, learning rates and times
        (_history_buffer_statistic, 'builtins.getattr'),  # HistoryBuffer's statistics methods, by reference
        # numpy arrays (HistoryBuffer's history, numpy's random generator state), dtypes and scalars
        np.ndarray, np.dtype, multiarray._reconstruct, multiarray.scalar,
        # the class of each numeric dtype (numpy.dtypes.Float64DType, ...): unpickling a dtype sets its state
        *(type(np.dtype(scalar_type)) for scalar_type in NUMPY_NUMBER_TYPES),
        # the same two functions under the names numpy 1.x pickles them by (checkpoints saved with numpy < 2)
        (multiarray._reconstruct, 'numpy.core.multiarray._reconstruct'),
        (multiarray.scalar, 'numpy.core.multiarray.scalar'),
    ]


def _offending_globals(filename: str, error: pickle.UnpicklingError) -> str:
    """What in a checkpoint torch's weights-only unpickler refused: the classes and functions it names."""
    try:  # every one the file names outside the allow-lists
        unsafe = torch.serialization.get_unsafe_globals_in_checkpoint(filename)
    except ValueError:  # torch's legacy (pre-1.6) file format, which that cannot scan
        unsafe = []
    if unsafe:
        return ', '.join(unsafe)
    # the one the unpickler met first (legacy format), or what it refused to build or call
    found = re.search(r'GLOBAL ([\w.]+)|WeightsUnpickler error:\s*(.+)', str(error))
    return (found.group(1) or found.group(2)).strip() if found else str(error)


def load_from_local(filename, map_location=None):
    """mmengine's ``load_from_local`` (the loader of local checkpoint files) with safe loading."""
    # mmengine 0.10.7 calls torch.load without weights_only (runner/checkpoint.py); since torch 2.6 the
    # default is weights_only=True, which refuses the HistoryBuffer and numpy objects that every
    # Runner checkpoint holds, so load_from, --resume and tools/test.py fail with UnpicklingError.
    # mmengine's unreleased fix (PR #1670) passes weights_only=False, which lets any .pth run code while it is
    # loaded; we keep torch's weights-only unpickler and allow exactly the types mmengine checkpoints hold.
    filename = osp.expanduser(filename)
    if not osp.isfile(filename):
        raise FileNotFoundError(f'{filename} can not be found.')
    with torch.serialization.safe_globals(checkpoint_safe_globals()):
        try:
            return torch.load(filename, map_location=map_location, weights_only=True)
        except pickle.UnpicklingError as error:
            offending = _offending_globals(filename, error)
            raise UnsafeCheckpointError(
                f'Refusing to load the checkpoint {filename}: it holds {offending}, which a checkpoint of weights '
                'and training state does not need and which could run code while it is loaded. condtok_mm loads '
                'checkpoints with torch.load(weights_only=True), allowing only tensors, built-in types and those '
                'of condtok_mm.compat.checkpoint_safe_globals(). Load checkpoints from sources you trust only; to '
                'use this one anyway, load it yourself with torch.load(path, weights_only=False) and '
                "torch.save({'state_dict': ...}) the tensors you need.") from None


# ----------------------------------------------------------------------------------------------------------
# Distributed runs without a GPU
# ----------------------------------------------------------------------------------------------------------
def runs_on_cpu() -> bool:
    """Whether mmengine puts models on the CPU here (no CUDA, NPU, MLU, MPS or MUSA device is available)."""
    return get_device() == 'cpu'


def _cpu_backend(backend: str) -> str:
    # mmengine's default is dist_cfg=dict(backend='nccl') (Runner, mmdet's default_runtime.py), and NCCL
    # only moves GPU tensors; gloo is torch.distributed's CPU backend.
    if backend == 'nccl':
        if os.environ['RANK'] == '0':  # once per job (no process group yet to ask the rank)
            print_log('No GPU is available: torch.distributed uses the gloo backend instead of nccl.',
                      logger='current', level=logging.INFO)
        return 'gloo'
    return backend


def _check_cpu_init_backend(init_backend: str) -> None:
    if init_backend != 'torch':
        raise ValueError(f"env_cfg.dist_cfg.init_backend={init_backend!r} needs a GPU, and none is "
                         "available. Remove init_backend from dist_cfg (or set it to 'torch') to run on the "
                         'CPU with gloo.')


def _init_dist_pytorch(backend, init_backend='torch', **kwargs) -> None:
    """mmengine's ``_init_dist_pytorch`` (the ``--launcher pytorch`` path), usable without a GPU."""
    # Without torchrun mmengine stops with a bare KeyError: 'RANK'.
    required = ('RANK', 'WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT')
    missing = [name for name in required if name not in os.environ]
    if missing:
        raise RuntimeError(f'--launcher pytorch needs {", ".join(missing)}, which torchrun sets for each '
                           'process: start the job with tools/dist_train.sh or tools/dist_test.sh '
                           '(torchrun), or leave out --launcher to run one process.')
    if not runs_on_cpu():
        return _upstream_init_dist_pytorch(backend, init_backend=init_backend, **kwargs)
    # mmengine 0.10.7 (dist/utils.py L130) calls torch.cuda.set_device(local_rank) before
    # init_process_group whatever the backend; without a GPU that raises ("Found no NVIDIA driver on your
    # system" on CUDA builds of torch), so torchrun on a CPU machine fails in every process.
    _check_cpu_init_backend(init_backend)
    torch_dist.init_process_group(backend=_cpu_backend(backend), **kwargs)


def set_torch_dist_env_from_slurm(port=None) -> None:
    """Set MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK and LOCAL_RANK from the variables srun sets.

    The rules are those of mmengine's ``_init_dist_slurm`` (dist/utils.py L175-214): the master is the first
    node of SLURM_NODELIST unless MASTER_ADDR is set, the port is ``port``, else MASTER_PORT, else 29500.
    """
    required = ('SLURM_PROCID', 'SLURM_NTASKS', 'SLURM_NODELIST', 'SLURM_LOCALID')
    missing = [name for name in required if name not in os.environ]
    if missing:
        raise RuntimeError(f'--launcher slurm needs {", ".join(missing)}, which srun sets for each task: '
                           'start the job with tools/slurm_train.sh or tools/slurm_test.sh (or srun), or '
                           'use tools/dist_train.sh (torchrun, --launcher pytorch) outside SLURM.')
    if port is not None:
        os.environ['MASTER_PORT'] = str(port)
    elif 'MASTER_PORT' not in os.environ:
        os.environ['MASTER_PORT'] = '29500'  # torch.distributed's default port
    if 'MASTER_ADDR' not in os.environ:
        node_list = os.environ['SLURM_NODELIST']
        try:
            hostnames = subprocess.run(['scontrol', 'show', 'hostname', node_list], check=True,
                                       capture_output=True, text=True).stdout.split()
        except (OSError, subprocess.CalledProcessError) as error:
            raise RuntimeError(f'Could not find the master node of SLURM_NODELIST={node_list!r} with '
                               f'`scontrol show hostname` ({error}). Set MASTER_ADDR to the address of the '
                               'first node.') from error
        os.environ['MASTER_ADDR'] = hostnames[0]
    os.environ['WORLD_SIZE'] = os.environ['SLURM_NTASKS']
    os.environ['RANK'] = os.environ['SLURM_PROCID']
    os.environ['LOCAL_RANK'] = os.environ['SLURM_LOCALID']


def _init_dist_slurm(backend, port=None, init_backend='torch', **kwargs) -> None:
    """mmengine's ``_init_dist_slurm`` (the ``--launcher slurm`` path), usable without a GPU."""
    if not runs_on_cpu():
        return _upstream_init_dist_slurm(backend, port=port, init_backend=init_backend, **kwargs)
    # mmengine 0.10.7 (dist/utils.py L221) calls torch.cuda.set_device(local_rank) here too, and falls back
    # (L198) to `proc_id % torch.cuda.device_count()` (a division by zero without a GPU) for the local rank.
    _check_cpu_init_backend(init_backend)
    set_torch_dist_env_from_slurm(port)
    torch_dist.init_process_group(backend=_cpu_backend(backend), **kwargs)


def _wrap_model(self, model_wrapper_cfg, model):
    """``Runner.wrap_model`` that leaves ``device_ids`` unset for a model on the CPU."""
    if self.distributed and runs_on_cpu() and not is_model_wrapper(model):
        # mmengine 0.10.7 Runner.wrap_model (runner.py L900 and L911) passes device_ids=[LOCAL_RANK] to
        # DistributedDataParallel; for a module on the CPU, DDP requires device_ids=None and raises
        # "DistributedDataParallel device_ids and output_device arguments only work with single-device/
        # multiple-device GPU modules or CPU modules" otherwise. An explicit model_wrapper_cfg takes
        # precedence over these defaults, as in mmengine.
        if model_wrapper_cfg is None:
            model_wrapper_cfg = dict(
                type='MMDistributedDataParallel',
                broadcast_buffers=False,
                find_unused_parameters=self.cfg.get('find_unused_parameters', False))
        model_wrapper_cfg = dict(model_wrapper_cfg)
        wrapper_type = MODEL_WRAPPERS.get(model_wrapper_cfg.setdefault('type', 'MMDistributedDataParallel'))
        if isinstance(wrapper_type, type) and issubclass(wrapper_type, DistributedDataParallel):
            model_wrapper_cfg.setdefault('device_ids', None)
    return _upstream_wrap_model(self, model_wrapper_cfg, model)


# ----------------------------------------------------------------------------------------------------------
# --auto-scale-lr
# ----------------------------------------------------------------------------------------------------------
def _scale_lr(self, optim_wrapper, auto_scale_lr=None) -> None:
    """``Runner.scale_lr`` that also scales the learning rate the log reports as ``base_lr``."""
    # mmengine 0.10.7 Runner.scale_lr (runner.py L928-985) scales optimizer.param_groups but not
    # OptimWrapper.base_param_settings, the extra group through which the param schedulers and the logger
    # track `base_lr`; with --auto-scale-lr the log then shows the unscaled base_lr next to the scaled lr.
    wrappers = (list(optim_wrapper.values())
                if isinstance(optim_wrapper, OptimWrapperDict) else [optim_wrapper])
    config_lrs = [wrapper.optimizer.param_groups[0]['lr'] for wrapper in wrappers]
    _upstream_scale_lr(self, optim_wrapper, auto_scale_lr)
    for wrapper, config_lr in zip(wrappers, config_lrs):
        if wrapper.base_param_settings is not None and config_lr > 0:
            wrapper.base_param_settings['lr'] *= wrapper.optimizer.param_groups[0]['lr'] / config_lr


# ----------------------------------------------------------------------------------------------------------
# Interruption safety
# ----------------------------------------------------------------------------------------------------------
def _replace_atomically(path: str, write) -> None:
    """Call ``write(f)`` on a temporary file beside ``path``, then rename it to ``path``.

    A rename within one file system is atomic (POSIX rename(2)): a reader, or a run resumed after the writer
    was killed, sees either the old file or the complete new one, never a truncated one.
    """
    directory, name = osp.split(osp.abspath(path))
    os.makedirs(directory, exist_ok=True)
    # Hidden and not ending in .pth, so that nothing that lists checkpoints picks it up.
    tmp_path = osp.join(directory, f'.{name}.{os.getpid()}.tmp')
    try:
        with open(tmp_path, 'wb') as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())  # the data reaches the disk before the rename makes it visible
        os.replace(tmp_path, path)
    finally:
        if osp.exists(tmp_path):
            os.remove(tmp_path)


def save_checkpoint(checkpoint, filename, file_client_args=None, backend_args=None) -> None:
    """mmengine's ``save_checkpoint``, writing local files atomically.

    mmengine 0.10.7 (runner/checkpoint.py L791-793) hands the serialized checkpoint to LocalBackend.put,
    which opens the final path with 'wb' and writes into it: a run killed during the write (SIGKILL, the
    OOM killer, a preempted job) leaves a truncated epoch_N.pth, and --resume then fails on it.
    Remote back ends (and pavi://, file_client_args) keep mmengine's code.
    """
    if file_client_args is not None or not isinstance(
            get_file_backend(filename, backend_args=backend_args), LocalBackend):
        return _upstream_save_checkpoint(checkpoint, filename, file_client_args, backend_args)
    _replace_atomically(filename, lambda f: torch.save(checkpoint, f))


def _save_checkpoint_with_step(self, runner, step, meta) -> None:
    """``CheckpointHook._save_checkpoint_with_step`` (mmengine 0.10.7, hooks/checkpoint_hook.py L413-461),
    reordered so that no interruption leaves the work dir without a loadable latest checkpoint.

    Upstream, with ``max_keep_ckpts``, deletes the oldest checkpoint *before* saving the new one: with
    max_keep_ckpts=1 a run killed during the save has deleted the checkpoint that ``last_checkpoint`` still
    names. And it rewrites ``last_checkpoint`` in place, so a kill during that write leaves it empty. Here the
    new checkpoint is saved first, ``last_checkpoint`` is then replaced atomically, and only then is the
    oldest checkpoint deleted. The bookkeeping (keep_ckpt_ids, last_ckpt in the message hub) is unchanged.
    """
    evicted_step = None
    if self.max_keep_ckpts > 0:
        # _save_checkpoint and _save_best_checkpoint may both save the same step in one epoch
        if not (len(self.keep_ckpt_ids) > 0 and self.keep_ckpt_ids[-1] == step):
            if len(self.keep_ckpt_ids) == self.max_keep_ckpts:
                evicted_step = self.keep_ckpt_ids.popleft()
            self.keep_ckpt_ids.append(step)
            runner.message_hub.update_info('keep_ckpt_ids', list(self.keep_ckpt_ids))

    ckpt_filename = self.filename_tmpl.format(step)
    self.last_ckpt = self.file_backend.join_path(self.out_dir, ckpt_filename)
    runner.message_hub.update_info('last_ckpt', self.last_ckpt)
    runner.save_checkpoint(
        self.out_dir,
        ckpt_filename,
        self.file_client_args,
        save_optimizer=self.save_optimizer,
        save_param_scheduler=self.save_param_scheduler,
        meta=meta,
        by_epoch=self.by_epoch,
        backend_args=self.backend_args,
        **self.args)

    # Model parallel-like training should involve pulling sharded states from all ranks; only rank 0 writes.
    if not is_main_process():
        return
    _replace_atomically(
        osp.join(runner.work_dir, 'last_checkpoint'), lambda f: f.write(self.last_ckpt.encode()))
    if evicted_step is not None:
        evicted_path = self.file_backend.join_path(self.out_dir, self.filename_tmpl.format(evicted_step))
        if self.file_backend.isfile(evicted_path):
            self.file_backend.remove(evicted_path)
        elif self.file_backend.isdir(evicted_path):  # checkpoints saved by deepspeed are directories
            self.file_backend.rmtree(evicted_path)


def get_random_states() -> dict:
    """The states of the global random generators this process draws from (Python, numpy, torch)."""
    states = dict(python=random.getstate(), numpy=np.random.get_state(), torch=torch.get_rng_state())
    if torch.cuda.is_available():
        states['cuda'] = torch.cuda.get_rng_state()
    return states


def set_random_states(states: dict) -> None:
    """Restore what :func:`get_random_states` returned."""
    random.setstate(states['python'])
    np.random.set_state(states['numpy'])
    torch.set_rng_state(states['torch'])
    if 'cuda' in states and torch.cuda.is_available():
        torch.cuda.set_rng_state(states['cuda'])


def _runner_save_checkpoint(self, *args, **kwargs):
    """``Runner.save_checkpoint`` that also saves every process's random generator states."""
    # mmengine 0.10.7 saves the model, optimizer, schedulers and message hub but no random generator state,
    # and re-seeds on resume: the resumed run draws different data augmentation (RandomFlip), RPN/RoI
    # samples and drop-path masks than the interrupted run would have, so it ends with other weights.
    # Every rank calls this method (CheckpointHook runs on all ranks; the write itself is rank 0's), so the
    # states of all ranks are gathered into the checkpoint: ranks draw different amounts (their images
    # differ), and each resumes its own stream.
    states = get_random_states()
    all_states = all_gather_object(states) if is_distributed() else [states]
    self.message_hub.update_info(RANDOM_STATES_KEY, all_states)
    return _upstream_runner_save_checkpoint(self, *args, **kwargs)


def _resume(self, filename, *args, **kwargs) -> None:
    """``Runner.resume`` that also restores this process's random generator states."""
    _upstream_resume(self, filename, *args, **kwargs)
    all_states = self.message_hub.get_info(RANDOM_STATES_KEY)
    rank, world_size = get_dist_info()
    if all_states is None:
        print_log(f'{filename} holds no random generator states (it was not saved with condtok_mm): the '
                  'resumed run draws new random numbers from the seed.', logger='current',
                  level=logging.WARNING)
    elif len(all_states) != world_size:
        print_log(f'{filename} was saved by {len(all_states)} processes and is resumed by {world_size}: the '
                  'resumed run draws new random numbers from the seed.', logger='current',
                  level=logging.WARNING)
    else:
        set_random_states(all_states[rank])


def _val_loop_run(self):
    """``ValLoop.run`` that leaves the global random generators as it found them."""
    # Validating draws from the global generators (each DataLoader iterator draws its base seed from torch's),
    # so without this a run validated after epoch N and a run resumed from epoch N's checkpoint (which does
    # not validate epoch N again) would continue with different random streams.
    states = get_random_states()
    try:
        return _upstream_val_loop_run(self)
    finally:
        set_random_states(states)


# ----------------------------------------------------------------------------------------------------------
# Which fixes the installed versions need, and applying them
# ----------------------------------------------------------------------------------------------------------
# The newest mmengine that has every bug fixed here (0.10.7, March 2025, was the newest release when this was
# written; `pip index versions mmengine`). A newer mmengine may have fixed any of them, so none is applied to
# it: re-check each against the new version before raising this bound.
LAST_MMENGINE_WITH_THE_BUGS = '0.10.7'


def mmengine_has_the_bugs() -> bool:
    """Whether the installed mmengine is one whose bugs these fixes cover (mmengine <= 0.10.7)."""
    return digit_version(mmengine.__version__) <= digit_version(LAST_MMENGINE_WITH_THE_BUGS)


def torch_loads_weights_only() -> bool:
    """Whether torch.load defaults to ``weights_only=True`` (torch >= 2.6), which mmengine <= 0.10.7 does not
    expect."""
    return digit_version(torch.__version__) >= digit_version('2.6.0')


def _use_local_checkpoint_loader():
    # mmengine logs the loader's name after its 10th character ('Loads checkpoint by local backend')
    CheckpointLoader.register_scheme(prefixes='', loader=load_from_local, force=True)


def _use_cpu_launchers():
    # init_dist looks both launchers up in its module at call time
    dist_utils._init_dist_pytorch = _init_dist_pytorch
    dist_utils._init_dist_slurm = _init_dist_slurm
    Runner.wrap_model = _wrap_model


def _use_scale_lr():
    Runner.scale_lr = _scale_lr


def _use_atomic_checkpoints():
    # save_checkpoint is imported by name into several mmengine modules (runner, runner.runner,
    # _strategy.*); rebind it wherever mmengine imported it.
    for name, module in list(sys.modules.items()):
        if name.startswith('mmengine') and getattr(module, 'save_checkpoint',
                                                   None) is _upstream_save_checkpoint:
            module.save_checkpoint = save_checkpoint
    CheckpointHook._save_checkpoint_with_step = _save_checkpoint_with_step


def _use_exact_resume():
    Runner.save_checkpoint = _runner_save_checkpoint
    Runner.resume = _resume
    ValLoop.run = _val_loop_run


class Fix(NamedTuple):
    name: str
    what: str  # one line for the log and the README
    needed: Callable[[], bool]  # whether the installed versions have the bug
    apply: Callable[[], None]


FIXES = (
    Fix('checkpoint_loading', 'local checkpoints load under torch >= 2.6 (mmengine <= 0.10.7 loads them with '
        "torch's default weights_only=True, which refuses its own HistoryBuffer and numpy objects)",
        lambda: mmengine_has_the_bugs() and torch_loads_weights_only(), _use_local_checkpoint_loader),
    Fix('cpu_launchers', '--launcher pytorch/slurm without a GPU: gloo instead of nccl, no '
        'torch.cuda.set_device, DDP without device_ids', mmengine_has_the_bugs, _use_cpu_launchers),
    Fix('auto_scale_lr', "--auto-scale-lr also scales the base_lr that the log reports", mmengine_has_the_bugs,
        _use_scale_lr),
    Fix('atomic_checkpoints', 'checkpoints and last_checkpoint are written to a temporary file and renamed; the '
        'oldest checkpoint is deleted only after the next one is saved', mmengine_has_the_bugs,
        _use_atomic_checkpoints),
    Fix('exact_resume', "checkpoints carry every process's random generator states, which --resume restores",
        mmengine_has_the_bugs, _use_exact_resume),
)
_applied: Set[str] = set()


def apply() -> Tuple[str, ...]:
    """Apply every fix of :data:`FIXES` that the installed versions need (once; calling again does nothing).

    Returns:
        tuple[str]: the names of the fixes applied in this process, by this call or an earlier one.
    """
    for fix in FIXES:
        if fix.name in _applied:
            continue
        if fix.needed():
            fix.apply()
            _applied.add(fix.name)
        else:
            print_log(f'condtok_mm.compat: {fix.name} not applied: mmengine {mmengine.__version__} with torch '
                      f'{torch.__version__} does not have the bug it fixes ({fix.what}).', logger='current',
                      level=logging.DEBUG)
    return tuple(fix.name for fix in FIXES if fix.name in _applied)
