"""Run-time fixes for bugs of the installed OpenMMLab stack (mmengine <= 0.10.7 with torch >= 2.6). Opt-in.

Importing condtok_mm changes nothing outside its registries. These fixes change mmengine's behaviour for the
whole process, so they apply only when asked for, in one of two ways:

- ``condtok_mm.compat.apply()`` in Python (our ``tools/train.py``, ``tools/test.py`` and analysis tools call it);
- ``custom_imports = dict(imports=['condtok_mm', 'condtok_mm.compat.enable'])`` in a config (our configs do;
  importing :mod:`condtok_mm.compat.enable` calls ``apply()``).

Each fix is one module here, holding the upstream functions it replaces (captured when it is imported), its
own ``apply`` and, in its docstring, the upstream bug it covers (mmengine file:line). Each edits no installed
file and applies only where the installed version has the bug (:data:`FIXES`, ``needed``): every one of them
is in mmengine 0.10.7, the newest mmengine release when this was written, so each applies to mmengine <= 0.10.7
and is skipped, with a log line, on a newer one. The checkpoint loader also needs torch >= 2.6 (``weights_only``
checks with allow-lists).

- :mod:`.checkpoint_loading`: torch >= 2.6 refuses mmengine's checkpoints (``weights_only``), and mmengine loads
  those from a URL with ``weights_only=False``; every checkpoint (local, http(s)://, mmengine's other schemes)
  loads with torch's weights-only unpickler and an allow-list of exactly the types they hold, so that no
  checkpoint runs code.
- :mod:`.cpu_launchers`: distributed runs without a GPU (``torchrun``/``srun`` on CPU machines): mmengine's
  launchers select a CUDA device, default to NCCL and pass ``device_ids`` to DDP. These fixes act only when no
  GPU is available (``mmengine.device.get_device() == 'cpu'``); on GPU machines mmengine's code runs unchanged.
- :mod:`.auto_scale_lr`: with ``--auto-scale-lr`` the ``base_lr`` that the log reports is scaled with the
  learning rates.
- :mod:`.atomic_checkpoints` and :mod:`.exact_resume`: interruption safety: checkpoints and
  ``last_checkpoint`` are written to a temporary file and renamed, and a checkpoint carries each process's
  random generator states so that ``--resume`` continues the same random streams as the run that was
  interrupted.
- :mod:`.config_formatting`: a run formats its config with yapf once, not at each of the five reads of
  ``Config.pretty_text``.
"""
import logging
from typing import Callable, NamedTuple, Set, Tuple

import mmengine
import torch
from mmengine.logging import print_log

from . import (atomic_checkpoints, auto_scale_lr, checkpoint_loading, config_formatting, cpu_launchers,
               exact_resume)
from .atomic_checkpoints import save_checkpoint
from .checkpoint_loading import (HISTORY_BUFFER_STATISTICS, NUMPY_NUMBER_TYPES, UnreadableCheckpointError,
                                 UnsafeCheckpointError, checkpoint_safe_globals, load_from_local)
from .cpu_launchers import runs_on_cpu, set_torch_dist_env_from_slurm
from .exact_resume import RANDOM_STATES_KEY, get_random_states, set_random_states
from .versions import LAST_MMENGINE_WITH_THE_BUGS, mmengine_has_the_bugs, torch_loads_weights_only

__all__ = [
    'FIXES', 'Fix', 'apply', 'LAST_MMENGINE_WITH_THE_BUGS', 'mmengine_has_the_bugs', 'torch_loads_weights_only',
    'UnsafeCheckpointError', 'UnreadableCheckpointError', 'HISTORY_BUFFER_STATISTICS', 'NUMPY_NUMBER_TYPES',
    'checkpoint_safe_globals', 'load_from_local', 'runs_on_cpu', 'set_torch_dist_env_from_slurm', 'save_checkpoint',
    'RANDOM_STATES_KEY', 'get_random_states', 'set_random_states'
]


class Fix(NamedTuple):
    name: str
    what: str  # one line for the log and the README
    needed: Callable[[], bool]  # whether the installed versions have the bug
    apply: Callable[[], None]


FIXES = (
    Fix('checkpoint_loading', 'checkpoints from local paths, http(s):// and every other mmengine scheme load with '
        "torch's weights-only unpickler and an allow-list of the types mmengine checkpoints hold (mmengine <= 0.10.7 "
        "fails on its own checkpoints under torch >= 2.6, and runs the pickle of one from a URL)",
        lambda: mmengine_has_the_bugs() and torch_loads_weights_only(), checkpoint_loading.apply),
    Fix('cpu_launchers', '--launcher pytorch/slurm without a GPU: gloo instead of nccl, no '
        'torch.cuda.set_device, DDP without device_ids', mmengine_has_the_bugs, cpu_launchers.apply),
    Fix('auto_scale_lr', "--auto-scale-lr also scales the base_lr that the log reports", mmengine_has_the_bugs,
        auto_scale_lr.apply),
    Fix('atomic_checkpoints', 'checkpoints and last_checkpoint are written to a temporary file and renamed; the '
        'oldest checkpoint is deleted only after the next one is saved', mmengine_has_the_bugs,
        atomic_checkpoints.apply),
    Fix('exact_resume', "checkpoints carry every process's random generator states, which --resume restores",
        mmengine_has_the_bugs, exact_resume.apply),
    Fix('config_formatting', 'a config is formatted by yapf once per text instead of at every read of '
        'Config.pretty_text (five a training run)', mmengine_has_the_bugs, config_formatting.apply),
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
