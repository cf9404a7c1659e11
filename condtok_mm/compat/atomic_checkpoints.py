"""Checkpoints that survive a kill (mends mmengine/runner/checkpoint.py and hooks/checkpoint_hook.py).

- mmengine 0.10.7 ``save_checkpoint`` (runner/checkpoint.py L791-793) hands the serialized checkpoint to
  LocalBackend.put, which opens the final path with 'wb' and writes into it: a run killed during the write
  leaves a truncated epoch_N.pth, and ``--resume`` then fails on it.
- ``CheckpointHook._save_checkpoint_with_step`` (hooks/checkpoint_hook.py L413-461), with ``max_keep_ckpts``,
  deletes the oldest checkpoint *before* saving the new one, and rewrites ``last_checkpoint`` in place.

Here checkpoints and ``last_checkpoint`` are written to a temporary file and renamed, and the oldest checkpoint
is deleted only after the next one is saved.
"""
import os
import os.path as osp
import sys

import torch
from mmengine.dist import is_main_process
from mmengine.fileio import LocalBackend, get_file_backend
from mmengine.hooks import CheckpointHook
from mmengine.runner import checkpoint as checkpoint_module

_upstream_save_checkpoint = checkpoint_module.save_checkpoint


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


def apply() -> None:
    # save_checkpoint is imported by name into several mmengine modules (runner, runner.runner,
    # _strategy.*); rebind it wherever mmengine imported it.
    for name, module in list(sys.modules.items()):
        if name.startswith('mmengine') and getattr(module, 'save_checkpoint',
                                                   None) is _upstream_save_checkpoint:
            module.save_checkpoint = save_checkpoint
    CheckpointHook._save_checkpoint_with_step = _save_checkpoint_with_step
