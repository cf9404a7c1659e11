"""Resuming exactly: checkpoints carry every process's random generator states (mends mmengine/runner/runner.py).

mmengine 0.10.7 ``Runner.save_checkpoint`` (runner/runner.py L2147) saves the model, optimizer, schedulers and
message hub but no random generator state, and ``Runner.resume`` (L1997) re-seeds: the resumed run draws
different data augmentation (RandomFlip), RPN/RoI samples and drop-path masks than the interrupted run would
have, so it ends with other weights. ``ValLoop.run`` (runner/loops.py L370) draws from the global generators
too. Here every rank's states are saved in the message hub's runtime information and restored on resume, and
validation leaves the generators as it found them.
"""
import logging
import random

import numpy as np
import torch
from mmengine.dist import all_gather_object, get_dist_info, is_distributed
from mmengine.logging import print_log
from mmengine.runner import Runner, ValLoop

# Where a checkpoint keeps the random generator states of the processes that saved it (a list, one entry per
# rank), inside the message hub's runtime information that mmengine saves and resumes.
RANDOM_STATES_KEY = 'condtok_mm_random_states'

_upstream_runner_save_checkpoint = Runner.save_checkpoint
_upstream_resume = Runner.resume
_upstream_val_loop_run = ValLoop.run


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


def apply() -> None:
    Runner.save_checkpoint = _runner_save_checkpoint
    Runner.resume = _resume
    ValLoop.run = _val_loop_run
