"""Distributed runs without a GPU (``torchrun``/``srun`` on CPU machines) (mends mmengine/dist/utils.py).

mmengine 0.10.7's launchers select a CUDA device, default to NCCL and pass ``device_ids`` to DDP:

- ``_init_dist_pytorch`` (dist/utils.py L130) and ``_init_dist_slurm`` (L221) call
  ``torch.cuda.set_device(local_rank)`` before ``init_process_group`` whatever the backend, and
  ``_init_dist_slurm`` falls back (L198) to ``proc_id % torch.cuda.device_count()`` for the local rank;
- ``Runner.wrap_model`` (runner/runner.py L900 and L911, the one other mmengine file this fix touches) passes
  ``device_ids=[LOCAL_RANK]`` to DistributedDataParallel, which a module on the CPU refuses.

These fixes act only when no GPU is available (``mmengine.device.get_device() == 'cpu'``); on GPU machines
mmengine's code runs unchanged.
"""
import logging
import os
import subprocess

import torch.distributed as torch_dist
from mmengine.device import get_device
from mmengine.dist import utils as dist_utils
from mmengine.logging import print_log
from mmengine.model import is_model_wrapper
from mmengine.registry import MODEL_WRAPPERS
from mmengine.runner import Runner
from torch.nn.parallel import DistributedDataParallel

_upstream_init_dist_pytorch = dist_utils._init_dist_pytorch
_upstream_init_dist_slurm = dist_utils._init_dist_slurm
_upstream_wrap_model = Runner.wrap_model


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


def apply() -> None:
    # init_dist looks both launchers up in its module at call time
    dist_utils._init_dist_pytorch = _init_dist_pytorch
    dist_utils._init_dist_slurm = _init_dist_slurm
    Runner.wrap_model = _wrap_model
