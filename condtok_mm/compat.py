"""Run-time fixes for the pinned stack (torch 2.14, mmengine 0.10.7), applied once on import.

Each fix says which upstream bug it covers; none edits an installed package.
"""
import torch
from mmengine.runner.checkpoint import CheckpointLoader

_applied = False


def _load_local_checkpoint(filename, map_location=None):
    # mmengine 0.10.7 calls torch.load without weights_only (runner/checkpoint.py); since torch 2.6 the
    # default is weights_only=True, which refuses the HistoryBuffer and numpy objects that every
    # Runner checkpoint holds, so load_from, --resume and tools/test.py fail with UnpicklingError.
    # mmengine fixed it on main (PR #1670, weights_only=False) but never released it; we do the same for
    # local files, which are the checkpoints the user chose to load.
    import os.path as osp
    filename = osp.expanduser(filename)
    if not osp.isfile(filename):
        raise FileNotFoundError(f'{filename} can not be found.')
    return torch.load(filename, map_location=map_location, weights_only=False)


def apply() -> None:
    """Apply every fix once (idempotent)."""
    global _applied
    if _applied:
        return
    CheckpointLoader.register_scheme(prefixes='', loader=_load_local_checkpoint, force=True)
    _applied = True
