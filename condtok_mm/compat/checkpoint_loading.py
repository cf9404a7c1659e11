"""Checkpoints load with torch's weights-only unpickler and an allow-list (mends mmengine/runner/checkpoint.py).

Every way mmengine reads a checkpoint (``load_from``, ``--resume``, ``tools/test.py``,
``init_cfg=dict(type='Pretrained')``, mmdet's backbones' own ``init_weights``) goes through
``CheckpointLoader``'s schemes (runner/checkpoint.py L333-533), and each is mended here:

- ``load_from_local`` (L347, local paths) calls ``torch.load`` without ``weights_only``; since torch 2.6 the
  default is ``weights_only=True``, which refuses the HistoryBuffer and numpy objects that every Runner
  checkpoint holds, so ``load_from``, ``--resume`` and ``tools/test.py`` fail with UnpicklingError. mmengine's
  unreleased fix (PR #1670) passes ``weights_only=False``, which lets any .pth run code while it is loaded.
- ``load_from_http`` (L371 and L379, ``http://``/``https://``) calls ``mmengine.utils.dl_utils.load_url``,
  which for torch >= 1.7 is ``torch.hub.load_state_dict_from_url`` (utils/dl_utils/hub.py L129), whose default
  is ``weights_only=False`` (torch 2.14 torch/hub.py L836): a checkpoint from a URL runs its pickle. The
  ``torchvision://``/``modelzoo://`` (L465), ``open-mmlab://`` (L502) and ``mmcls://`` (L525) schemes resolve
  a name to a URL and call ``load_from_http``.
- ``open-mmlab://`` names that resolve to a file in $MMENGINE_HOME (L507), ``s3://``/``petrel://`` (L438) and
  ``pavi://`` (L415) call ``torch.load`` with torch's default (weights-only since torch 2.6, without the
  allow-list that mmengine's own checkpoints need).

Here all of them load with torch's weights-only unpickler, allowing exactly the types mmengine checkpoints hold,
and refuse anything else with :class:`UnsafeCheckpointError`. Downloads land where mmengine puts them
(torch.hub's cache, ``<torch.hub.get_dir()>/checkpoints``), under a name keyed by the whole URL
(:func:`url_cache_name`; torch.hub keys by the file name, so two URLs ending in the same name would share one).

:func:`apply` installs the loaders for the whole process (the opt-in); :func:`weights_only_loading` installs them
for a block and restores mmengine's after it, which is how condtok_mm's own modules load their checkpoints.
"""
import contextlib
import hashlib
import io
import os
import os.path as osp
import pickle
import re
import struct
import threading
import warnings
from collections import OrderedDict
from tempfile import TemporaryDirectory
from urllib.parse import urlparse

import numpy as np
import torch
from mmengine.dist import get_dist_info
from mmengine.fileio import get_file_backend
from mmengine.logging import HistoryBuffer
from mmengine.runner import checkpoint as checkpoint_module
from mmengine.runner.checkpoint import CheckpointLoader


class UnsafeCheckpointError(pickle.UnpicklingError):
    """A checkpoint holds objects of types outside :func:`checkpoint_safe_globals`: loading it could run code."""


class UnreadableCheckpointError(ValueError):
    """A checkpoint path that holds no checkpoint torch can read: a directory, an empty, cut-off or corrupt file, or
    a file that torch.save did not write; the message names it and the fix."""


# How a file that torch.save wrote starts: its zip format (torch >= 1.6), or the legacy format's pickle (protocol 2)
ZIP_START, LEGACY_START = b'PK\x03\x04', b'\x80'
# What torch says of a file it cannot read to the end: a zip archive's reader, the legacy format's storage reads
CORRUPT_FILE_MESSAGES = re.compile(r'PytorchStreamReader failed|The file might be corrupted')


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


def _offending_globals(file, error: pickle.UnpicklingError) -> str:
    """What in a checkpoint torch's weights-only unpickler refused: the classes and functions it names."""
    if hasattr(file, 'seek'):
        file.seek(0)
    try:  # every one the file names outside the allow-lists
        unsafe = torch.serialization.get_unsafe_globals_in_checkpoint(file)
    except ValueError:  # torch's legacy (pre-1.6) file format, which that cannot scan
        unsafe = []
    if unsafe:
        return ', '.join(unsafe)
    # the one the unpickler met first (legacy format), or what it refused to build or call
    found = re.search(r'GLOBAL ([\w.]+)|WeightsUnpickler error:\s*(.+)', str(error))
    return (found.group(1) or found.group(2)).strip() if found else str(error)


def _start_of(file, size=16):
    """The first ``size`` bytes of ``file`` (a path or a binary buffer)."""
    if hasattr(file, 'seek'):
        file.seek(0)
        return file.read(size)
    with open(file, 'rb') as f:
        return f.read(size)


def _unreadable(source: str, file, error: Exception):
    """The :class:`UnreadableCheckpointError` for ``error``, raised by torch.load of ``file``, where the file is
    empty, was not written by torch.save, or is cut off or corrupt; None where ``error`` says something else (a
    pickle that the weights-only unpickler refused, a device that map_location cannot give)."""
    start = _start_of(file)
    if not start:
        return UnreadableCheckpointError(
            f'{source} is empty (0 bytes), not a checkpoint: a save or a download that was cut off (a killed run, a '
            'full disk) leaves one. Give another checkpoint, or delete it and save or download it again.')
    cut_in_zip_start = len(start) < len(ZIP_START) and ZIP_START.startswith(start)
    if not (start.startswith((ZIP_START, LEGACY_START)) or cut_in_zip_start):
        return UnreadableCheckpointError(
            f'{source} is not a checkpoint that torch.save wrote (it starts with {start!r}). Give the .pth file of '
            'a checkpoint.')
    if cut_in_zip_start:
        reason = 'it ends inside the zip header'
    elif isinstance(error, pickle.UnpicklingError) or (isinstance(error, RuntimeError)
                                                       and not CORRUPT_FILE_MESSAGES.search(str(error))):
        return None
    else:
        reason = str(error).split('. ')[0] or 'it ends before the checkpoint does'
    return UnreadableCheckpointError(
        f'{source} is cut off or corrupt ({reason}): a save or a download that did not finish leaves one. Give '
        'another checkpoint, or save or download it again.')


def _load_weights_only(load, source: str, file):
    """``load()`` (a torch.load with weights_only=True of ``file``) with the allow-list in effect; a checkpoint
    that holds anything else is refused with an :class:`UnsafeCheckpointError` that names ``source``, a file that
    holds no checkpoint with an :class:`UnreadableCheckpointError` that names it."""
    with torch.serialization.safe_globals(checkpoint_safe_globals()):
        try:
            return load()
        except (EOFError, RuntimeError, struct.error, IndexError, UnicodeDecodeError) as error:  # a cut-off file
            unreadable = _unreadable(source, file, error)
            if unreadable is None:
                raise
            raise unreadable from None
        except pickle.UnpicklingError as error:
            unreadable = _unreadable(source, file, error)
            if unreadable is not None:
                raise unreadable from None
            offending = _offending_globals(file, error)
            raise UnsafeCheckpointError(
                f'Refusing to load the checkpoint {source}: it holds {offending}, which a checkpoint of weights '
                'and training state does not need and which could run code while it is loaded. condtok_mm loads '
                'checkpoints with torch.load(weights_only=True), allowing only tensors, built-in types and those '
                'of condtok_mm.compat.checkpoint_safe_globals(). Load checkpoints from sources you trust only; to '
                'use this one anyway, load it yourself with torch.load(path, weights_only=False) and '
                "torch.save({'state_dict': ...}) the tensors you need.") from None


def load_from_local(filename, map_location=None):
    """mmengine's ``load_from_local`` (the loader of local checkpoint files) with safe loading."""
    filename = osp.expanduser(filename)
    if osp.isdir(filename):
        held = sorted(name for name in os.listdir(filename) if name.endswith('.pth'))
        listing = ', '.join(held[:5]) + (', ...' if len(held) > 5 else '') if held else 'no .pth file'
        raise UnreadableCheckpointError(f'{filename} is a directory, not a checkpoint file: give the checkpoint file in '
                                        f'it (it holds {listing}).')
    if not osp.isfile(filename):
        raise FileNotFoundError(f'{filename} can not be found.')
    return _load_weights_only(lambda: torch.load(filename, map_location=map_location, weights_only=True),
                              filename, filename)


def url_cache_name(url):
    """The file name a URL's checkpoint is cached under: the URL's file name after the first 16 hex digits of the
    whole URL's SHA-256. torch.hub keys its cache by the file name alone, so .../v1/model.pth and .../v2/model.pth
    would load the same file."""
    return f'{hashlib.sha256(url.encode()).hexdigest()[:16]}-{osp.basename(urlparse(url).path)}'


def download_url(url, model_dir=None):
    """The local copy of a URL's checkpoint (downloaded once into ``model_dir``, default <torch hub dir>/checkpoints,
    under :func:`url_cache_name`); nothing in it is unpickled."""
    if model_dir is None:
        model_dir = osp.join(torch.hub.get_dir(), 'checkpoints')
    cached_file = osp.join(model_dir, url_cache_name(url))
    if not osp.isfile(cached_file):
        os.makedirs(model_dir, exist_ok=True)
        torch.hub.download_url_to_file(url, cached_file, progress=False)
    return cached_file


def _load_url(url, model_dir=None, map_location=None):
    # as mmengine's load_url, one download into the hub cache, but keyed by the whole URL and read weights-only
    cached_file = download_url(url, model_dir)
    return _load_weights_only(lambda: torch.load(cached_file, map_location=map_location, weights_only=True),
                              f'{url} (downloaded to {cached_file})', cached_file)


def load_from_http(filename, map_location=None, model_dir=None):
    """mmengine's ``load_from_http`` (``http://``, ``https://``) with safe loading: local rank 0 downloads
    first, as in mmengine."""
    rank, world_size = get_dist_info()
    if rank == 0:
        checkpoint = _load_url(filename, model_dir=model_dir, map_location=map_location)
    if world_size > 1:
        torch.distributed.barrier()
        if rank > 0:
            checkpoint = _load_url(filename, model_dir=model_dir, map_location=map_location)
    return checkpoint


def load_from_ceph(filename, map_location=None, backend='petrel'):
    """mmengine's ``load_from_ceph`` (``s3://``, ``petrel://``, read through petrel_client) with safe loading."""
    try:
        file_backend = get_file_backend(filename, backend_args={'backend': backend})
    except ImportError:  # mmengine's PetrelBackend: 'Please install petrel_client to enable PetrelBackend.'
        raise ImportError(f'Loading {filename} needs petrel_client, the client of OpenMMLab\'s Ceph storage, which is '
                          'not installed (and which needs that storage, not reachable offline). Download the '
                          'checkpoint and give its local path instead.') from None
    with io.BytesIO(file_backend.get(filename)) as buffer:
        return _load_weights_only(lambda: torch.load(buffer, map_location=map_location, weights_only=True),
                                  filename, buffer)


def load_from_pavi(filename, map_location=None):
    """mmengine's ``load_from_pavi`` (``pavi://``, OpenMMLab's model cloud) with safe loading."""
    assert filename.startswith('pavi://'), f'Expected filename startswith `pavi://`, but get {filename}'
    try:
        from pavi import modelcloud
    except ImportError:
        raise ImportError(f'Loading {filename} needs pavi, the client of OpenMMLab\'s model cloud, which is not '
                          'installed (and which needs that service, not reachable offline). Download the '
                          'checkpoint and give its local path instead.') from None
    model = modelcloud.get(filename[len('pavi://'):])
    with TemporaryDirectory() as tmp_dir:
        downloaded_file = osp.join(tmp_dir, model.name)
        model.download(downloaded_file)
        return _load_weights_only(
            lambda: torch.load(downloaded_file, map_location=map_location, weights_only=True), filename,
            downloaded_file)


def load_from_openmmlab(filename, map_location=None):
    """mmengine's ``load_from_openmmlab`` (``open-mmlab://NAME``: a URL or a file in $MMENGINE_HOME, from
    mmengine's open_mmlab.json and $MMENGINE_HOME/open_mmlab.json) with safe loading."""
    prefix = 'open-mmlab://' if filename.startswith('open-mmlab://') else 'openmmlab://'
    model_name = filename[len(prefix):]
    deprecated_names = checkpoint_module.get_deprecated_model_names()
    if model_name in deprecated_names:
        warnings.warn(f'{prefix}{model_name} is deprecated in favor of {prefix}{deprecated_names[model_name]}',
                      DeprecationWarning)
        model_name = deprecated_names[model_name]
    model_url = checkpoint_module.get_external_models()[model_name]
    if model_url.startswith(('http://', 'https://')):
        return load_from_http(model_url, map_location=map_location)
    return load_from_local(osp.join(checkpoint_module._get_mmengine_home(), model_url), map_location)


# The loader this module installs under each of mmengine's prefixes. torchvision://, modelzoo:// and mmcls://
# keep mmengine's loaders, which resolve the name to a URL and call load_from_http by its name in
# mmengine.runner.checkpoint (installed too).
SCHEMES = {
    '': load_from_local,
    'http://': load_from_http,
    'https://': load_from_http,
    r'(\S+\:)?s3://': load_from_ceph,
    r'(\S+\:)?petrel://': load_from_ceph,
    'pavi://': load_from_pavi,
    'open-mmlab://': load_from_openmmlab,
    'openmmlab://': load_from_openmmlab,
}

_LOADERS_LOCK = threading.Lock()  # held while the loaders are installed or restored and the blocks counted
_weights_only_depth = 0  # blocks inside weights_only_loading, in every thread
# What the last block to end restores: mmengine's loaders as the first block found them, or None once the process
# opted in (apply) while blocks were open.
_outer_loaders = None


def _install():
    # mmengine logs the loader's name after its 10th character ('Loads checkpoint by local backend')
    for loader in dict.fromkeys(SCHEMES.values()):  # each loader once, with its prefixes
        CheckpointLoader.register_scheme(prefixes=[prefix for prefix in SCHEMES if SCHEMES[prefix] is loader],
                                         loader=loader, force=True)
    checkpoint_module.load_from_http = load_from_http


def _restore(outer_schemes, outer_http):
    """mmengine's loaders back under each prefix that still holds the one :func:`_install` put there; a loader
    registered since (by the host, in another thread) stays, and so do prefixes added since."""
    restored = OrderedDict()
    for prefix, loader in CheckpointLoader._schemes.items():
        if SCHEMES.get(prefix) is not loader:
            restored[prefix] = loader  # registered since
        elif prefix in outer_schemes:
            restored[prefix] = outer_schemes[prefix]
    # swapped in whole, as register_scheme does: another thread may be iterating the schemes
    CheckpointLoader._schemes = restored
    if checkpoint_module.load_from_http is load_from_http:
        checkpoint_module.load_from_http = outer_http


@contextlib.contextmanager
def weights_only_loading():
    """Within it every scheme of mmengine's CheckpointLoader loads weights-only, as after :func:`apply`; after it
    the loaders are what they were. condtok_mm's modules load their checkpoints (their own ``init_cfg``, a
    wrapped module's) inside it, so that a host that did not opt in to condtok_mm.compat still never runs a
    checkpoint's pickle through them, and mmengine is left as the host has it. Nested and concurrent blocks (model
    builds in several threads) share one installation: the loaders come back when the last block ends, only under
    the prefixes that still hold the block's (a loader the host registered meanwhile stays), and not at all where
    the process opted in (:func:`apply`, in any thread) meanwhile."""
    global _weights_only_depth, _outer_loaders
    with _LOADERS_LOCK:
        if _weights_only_depth == 0:
            # register_scheme edits the dict in place before it sorts it into a new one: keep a copy
            _outer_loaders = OrderedDict(CheckpointLoader._schemes), checkpoint_module.load_from_http
            _install()
        _weights_only_depth += 1
    try:
        yield
    finally:
        with _LOADERS_LOCK:
            _weights_only_depth -= 1
            if _weights_only_depth == 0:
                if _outer_loaders is not None:
                    _restore(*_outer_loaders)
                _outer_loaders = None


def apply() -> None:
    """Install the weights-only loaders for the rest of the process (the opt-in): the
    :func:`weights_only_loading` blocks open now, in any thread, leave them in place when they end."""
    global _outer_loaders
    with _LOADERS_LOCK:
        _install()
        _outer_loaders = None
