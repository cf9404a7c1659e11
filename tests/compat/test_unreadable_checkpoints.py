"""A checkpoint path that holds no checkpoint (a directory, an empty, cut-off or corrupt file, a file torch.save did
not write) is refused by condtok_mm.compat's loaders with an UnreadableCheckpointError naming it and the fix,
wherever it is read (load_checkpoint, a URL, tools/test.py, tools/train.py's load_from), never with torch's bare
EOFError or zip error."""
import io
import os.path as osp
import re
import subprocess
import sys

import pytest
import torch
from mmengine.logging import HistoryBuffer
from mmengine.runner import load_checkpoint
from torch import nn

from condtok_mm import compat
from helpers.cfg_options import data_options
from helpers.loopback_server import serving
from helpers.repo import DEMO, REPO_ROOT

compat.apply()  # the opt-in our tools and configs make


def checkpoint_bytes(legacy_format=False):
    """A small checkpoint as a training run writes one (weights, meta, a message hub's HistoryBuffer)."""
    buffer = HistoryBuffer()
    buffer.update(1.5)
    saved = io.BytesIO()
    torch.save(dict(meta=dict(epoch=1), state_dict=nn.Linear(2, 1).state_dict(),
                    message_hub=dict(log_scalars={'train/loss': buffer})), saved,
               _use_new_zipfile_serialization=not legacy_format)
    return saved.getvalue()


def load(path):
    return load_checkpoint(nn.Linear(2, 1), str(path))  # what load_from, --resume and tools/test.py call


def test_a_directory_is_named_with_the_checkpoints_it_holds(tmp_path):
    for name in ('epoch_2.pth', 'epoch_1.pth', 'last_checkpoint'):
        (tmp_path / name).write_bytes(checkpoint_bytes())
    with pytest.raises(compat.UnreadableCheckpointError, match=re.escape(
            f'{tmp_path} is a directory, not a checkpoint file: give the checkpoint file in it (it holds '
            'epoch_1.pth, epoch_2.pth).')):
        load(tmp_path)


def test_an_empty_file_is_named_with_what_leaves_one(tmp_path):
    (tmp_path / 'epoch_1.pth').write_bytes(b'')
    with pytest.raises(compat.UnreadableCheckpointError, match=re.escape(
            f'{tmp_path / "epoch_1.pth"} is empty (0 bytes), not a checkpoint: a save or a download that was cut off')):
        load(tmp_path / 'epoch_1.pth')


@pytest.mark.parametrize('content', [b'not a checkpoint', b'{"state_dict": {}}', bytes(range(7, 40))])
def test_a_file_that_torch_save_did_not_write_is_named_with_how_it_starts(tmp_path, content):
    (tmp_path / 'model.pth').write_bytes(content)
    with pytest.raises(compat.UnreadableCheckpointError, match=re.escape(
            f'{tmp_path / "model.pth"} is not a checkpoint that torch.save wrote (it starts with {content[:16]!r})')):
        load(tmp_path / 'model.pth')


def test_a_cut_off_checkpoint_is_named_cut_off_at_every_length(tmp_path):
    whole = checkpoint_bytes()
    path = tmp_path / 'epoch_1.pth'
    for length in range(1, len(whole), 37):
        path.write_bytes(whole[:length])
        with pytest.raises(compat.UnreadableCheckpointError, match=re.escape(f'{path} is cut off or corrupt (')):
            load(path)
    path.write_bytes(whole)
    load(path)


def test_a_cut_off_legacy_checkpoint_is_refused_by_name_at_every_length(tmp_path):
    """The legacy format (torch < 1.6, and mmdet's published checkpoints) is one pickle: cut inside the name of a
    global, what is left names one outside the allow-list and is refused as unsafe; everywhere else it is named
    cut off."""
    whole = checkpoint_bytes(legacy_format=True)
    path = tmp_path / 'epoch_1.pth'
    refused = set()
    for length in range(1, len(whole)):
        path.write_bytes(whole[:length])
        with pytest.raises((compat.UnreadableCheckpointError, compat.UnsafeCheckpointError)) as error:
            load(path)
        assert str(error.value).startswith((f'{path} is cut off or corrupt (',
                                            f'Refusing to load the checkpoint {path}: it holds '))
        refused.add(type(error.value))
    assert refused == {compat.UnreadableCheckpointError, compat.UnsafeCheckpointError}
    path.write_bytes(whole)
    load(path)


def test_an_empty_download_is_named_by_its_url(tmp_path, monkeypatch):
    monkeypatch.setenv('TORCH_HOME', str(tmp_path / 'torch_home'))
    monkeypatch.setenv('NO_PROXY', '127.0.0.1,localhost')
    monkeypatch.setattr(torch.hub, '_hub_dir', None)
    (tmp_path / 'empty.pth').write_bytes(b'')
    with serving(tmp_path) as url:
        with pytest.raises(compat.UnreadableCheckpointError, match=re.escape(f'{url}/empty.pth (downloaded to ')):
            load(f'{url}/empty.pth')


@pytest.mark.slow  # a fresh Python process (~10 s of imports on 2 cores)
@pytest.mark.parametrize('tool, checkpoint', [('test.py', 'a directory'), ('test.py', 'an empty file'),
                                              ('train.py', 'an empty file')])
def test_the_tools_stop_naming_a_checkpoint_that_holds_none(tool, checkpoint, shapes_root, tmp_path):
    path = tmp_path / ('work_dir' if checkpoint == 'a directory' else 'epoch_12.pth')
    path.mkdir() if checkpoint == 'a directory' else path.write_bytes(b'')
    given = [str(path)] if tool == 'test.py' else []
    loaded = [] if tool == 'test.py' else [f'load_from={path}']
    result = subprocess.run([sys.executable, osp.join(REPO_ROOT, 'tools', tool), DEMO, *given, '--work-dir',
                             str(tmp_path / 'run'), '--cfg-options', *data_options(shapes_root, 1), *loaded],
                            capture_output=True, text=True, timeout=600, cwd=REPO_ROOT)
    assert result.returncode == 1, result.stderr[-3000:]
    what = 'is a directory, not a checkpoint file' if checkpoint == 'a directory' else 'is empty (0 bytes)'
    assert f'error: {path} {what}' in result.stderr, result.stderr[-3000:]
    assert 'Traceback' not in result.stderr
