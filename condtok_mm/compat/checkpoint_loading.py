"""Checkpoints load with torch's weights-only unpickler and an allow-list (mends mmengine/runner/checkpoint.py).

mmengine 0.10.7 ``load_from_local`` (runner/checkpoint.py L347) calls ``torch.load`` without ``weights_only``;
since torch 2.6 the default is ``weights_only=True``, which refuses the HistoryBuffer and numpy objects that
every Runner checkpoint holds, so ``load_from``, ``--resume`` and ``tools/test.py`` fail with UnpicklingError.
mmengine's unreleased fix (PR #1670) passes ``weights_only=False``, which lets any .pth run code while it is
loaded; here torch's weights-only unpickler is kept, allowing exactly the types mmengine checkpoints hold.
"""
import os.path as osp
import pickle
import re

import numpy as np
import torch
from mmengine.logging import HistoryBuffer
from mmengine.runner.checkpoint import CheckpointLoader


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


def apply() -> None:
    # mmengine logs the loader's name after its 10th character ('Loads checkpoint by local backend')
    CheckpointLoader.register_scheme(prefixes='', loader=load_from_local, force=True)
