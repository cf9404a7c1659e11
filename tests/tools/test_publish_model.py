"""tools/model_converters/publish_model.py: a training checkpoint kept as its weights and meta, named by the
SHA-256 of what it holds, and read without running code."""
import errno
import hashlib
import os
import os.path as osp

import pytest
import torch
from mmengine.logging import HistoryBuffer

from condtok_mm.compat.checkpoint_loading import UnsafeCheckpointError
from condtok_mm.model_converters import publish_model
from helpers.repo import run_main


def training_checkpoint(path):
    """A checkpoint as mmengine's CheckpointHook writes one: weights, meta, optimizer state, message hub."""
    state_dict = {'backbone.patch_embed.projection.weight': torch.randn(4, 3, 2, 2), 'head.fc.bias': torch.randn(5)}
    buffer = HistoryBuffer()
    buffer.update(1.5)
    torch.save(dict(meta=dict(epoch=20, seed=1), state_dict=state_dict,
                    optimizer=dict(state={0: dict(exp_avg=torch.ones(3))}),
                    message_hub=dict(log_scalars={'train/loss': buffer})), path)
    return state_dict


def test_the_published_file_holds_the_weights_and_meta_under_its_sha256_prefix(tmp_path):
    state_dict = training_checkpoint(tmp_path / 'epoch_20.pth')
    final = publish_model.publish(str(tmp_path / 'epoch_20.pth'), str(tmp_path / 'out' / 'swin-mini.pth'))
    content = open(final, 'rb').read()
    assert final == str(tmp_path / 'out' / f'swin-mini-{hashlib.sha256(content).hexdigest()[:8]}.pth')
    assert not osp.exists(tmp_path / 'out' / 'swin-mini.pth')
    published = torch.load(final, weights_only=True)  # plain tensors and built-in types only
    assert sorted(published) == ['meta', 'state_dict'] and published['meta'] == dict(epoch=20, seed=1)
    assert published['state_dict'].keys() == state_dict.keys()
    for key, tensor in state_dict.items():
        assert torch.equal(published['state_dict'][key], tensor)


def test_keys_the_checkpoint_lacks_are_named_with_the_ones_it_has(tmp_path):
    training_checkpoint(tmp_path / 'epoch_20.pth')
    with pytest.raises(KeyError, match='has no ema_state_dict .it has meta, state_dict, optimizer, message_hub.'):
        publish_model.publish(str(tmp_path / 'epoch_20.pth'), str(tmp_path / 'a.pth'), ['ema_state_dict'])


class RunsCode:
    def __reduce__(self):
        return (print, ('this ran while the checkpoint was loaded', ))


def test_a_checkpoint_that_would_run_code_is_refused(tmp_path):
    path = tmp_path / 'epoch_1.pth'
    torch.save(dict(meta={}, state_dict={'w': torch.ones(1)}, extra=RunsCode()), path)
    with pytest.raises(UnsafeCheckpointError, match='Refusing to load the checkpoint'):
        publish_model.publish(str(path), str(tmp_path / 'a.pth'))
    assert not list(tmp_path.glob('a*.pth'))


def digest(path):
    return hashlib.sha256(open(path, 'rb').read()).hexdigest()


def test_publishing_a_checkpoint_onto_its_own_name_keeps_it_whole(tmp_path):
    path = tmp_path / 'epoch_12.pth'
    training_checkpoint(path)
    before = digest(path)
    final = publish_model.publish(str(path), str(path))
    assert digest(path) == before  # the optimizer state and message hub are still there
    assert sorted(torch.load(path, weights_only=False)) == ['message_hub', 'meta', 'optimizer', 'state_dict']
    assert final == str(tmp_path / f'epoch_12-{digest(final)[:8]}.pth')
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(['epoch_12.pth', osp.basename(final)])  # no temp


def test_an_existing_file_is_never_replaced(tmp_path):
    training_checkpoint(tmp_path / 'epoch_12.pth')
    other = tmp_path / 'epoch_4.pth'
    training_checkpoint(other)
    before = digest(other)
    final = publish_model.publish(str(tmp_path / 'epoch_12.pth'), str(other))  # OUT named like another checkpoint
    assert digest(other) == before and final != str(other)
    # the same content published again is left as it is; another content under that name is refused
    assert publish_model.publish(str(tmp_path / 'epoch_12.pth'), str(other)) == final
    held = open(final, 'rb').read()
    open(final, 'wb').write(b'something else')
    with pytest.raises(FileExistsError, match=f'{final} exists and holds something else'):
        publish_model.publish(str(tmp_path / 'epoch_12.pth'), str(other))
    assert open(final, 'rb').read() == b'something else' and held != b'something else'
    assert not list(tmp_path.glob('.publish-*'))  # no temporary file left behind


def test_the_published_file_is_readable_as_a_plain_open_would_make_it(tmp_path):
    training_checkpoint(tmp_path / 'epoch_12.pth')
    final = publish_model.publish(str(tmp_path / 'epoch_12.pth'), str(tmp_path / 'out.pth'))
    umask = os.umask(0)
    os.umask(umask)
    assert os.stat(final).st_mode & 0o777 == 0o666 & ~umask


def run_publish(*args):
    """publish_model.py ARGS run in this process: its exit status and stderr (an exception other than the
    tool's own exit fails the test with its traceback)."""
    return run_main(publish_model.main, 'tools/model_converters/publish_model.py', *args)


def published_name(tmp_path):
    """The name publishing tmp_path/epoch_20.pth as m.pth gives (the content, so the name, is the same each time)."""
    return osp.basename(publish_model.publish(str(tmp_path / 'epoch_20.pth'), str(tmp_path / 'probe' / 'm.pth')))


@pytest.mark.parametrize('taken_by', ['a dangling symbolic link', 'a folder'])
def test_a_target_name_taken_by_what_is_not_a_file_is_named_and_left_as_it_is(tmp_path, taken_by):
    training_checkpoint(tmp_path / 'epoch_20.pth')
    target = tmp_path / 'out' / published_name(tmp_path)
    target.parent.mkdir()
    if taken_by == 'a folder':
        target.mkdir()
        what = 'a folder'
    else:
        target.symlink_to(tmp_path / 'nowhere.pth')
        what = f'a symbolic link to {tmp_path / "nowhere.pth"}, which does not exist'
    result = run_publish(str(tmp_path / 'epoch_20.pth'), str(tmp_path / 'out' / 'm.pth'))
    assert result.returncode == 1
    assert result.stderr == f'error: {target} exists and is {what}; it is left as it is: give another OUT_FILE, or ' \
        'remove it\n'
    assert target.is_dir() if taken_by == 'a folder' else target.is_symlink() and not target.exists()
    assert sorted(path.name for path in target.parent.iterdir()) == [target.name]  # no temporary file left


def test_an_out_folder_that_cannot_be_written_is_named_with_the_fix(tmp_path, monkeypatch):
    training_checkpoint(tmp_path / 'epoch_20.pth')
    (tmp_path / 'read_only').mkdir()

    def read_only(*args, dir=None, **kwargs):  # as the OS answers a user without write permission there
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), osp.join(dir, '.publish-1.pth'))

    monkeypatch.setattr(publish_model.tempfile, 'mkstemp', read_only)
    result = run_publish(str(tmp_path / 'epoch_20.pth'), str(tmp_path / 'read_only' / 'm.pth'))
    assert (result.returncode, result.stderr) == (1, f'error: cannot write into {tmp_path / "read_only"} (Permission '
                                                     'denied): give an OUT_FILE in a folder you can write to\n')


def test_an_out_path_through_a_file_is_named(tmp_path):
    training_checkpoint(tmp_path / 'epoch_20.pth')
    (tmp_path / 'a_file').write_text('')
    result = run_publish(str(tmp_path / 'epoch_20.pth'), str(tmp_path / 'a_file' / 'm.pth'))
    assert (result.returncode, result.stderr) == (1, f'error: {tmp_path / "a_file"} cannot be a folder: a part of '
                                                     'that path is a file. Give an OUT_FILE in a folder\n')


@pytest.mark.parametrize('content, message', [
    (b'', 'is empty (0 bytes), not a checkpoint'),
    (None, 'is cut off or corrupt (PytorchStreamReader failed reading zip archive'),
    (b'weights: 1 2 3', "is not a checkpoint that torch.save wrote (it starts with b'weights: 1 2 3')"),
])
def test_an_in_file_that_holds_no_checkpoint_is_named(tmp_path, content, message):
    path = tmp_path / 'epoch_20.pth'
    if content is None:  # the first half of a checkpoint
        training_checkpoint(path)
        content = path.read_bytes()[:path.stat().st_size // 2]
    path.write_bytes(content)
    result = run_publish(str(path), str(tmp_path / 'out' / 'm.pth'))
    assert result.returncode == 1 and result.stderr.startswith(f'error: {path} {message}')
    assert not (tmp_path / 'out').exists() or not list((tmp_path / 'out').iterdir())


@pytest.mark.parametrize('out', ['published/', 'published', '.'])
def test_an_out_folder_stands_for_the_in_files_name_in_it(tmp_path, monkeypatch, out):
    # as cp and mv read a folder: one that ends with a slash (made where missing), or one that exists
    (tmp_path / 'runs').mkdir()
    training_checkpoint(tmp_path / 'runs' / 'epoch_20.pth')
    monkeypatch.chdir(tmp_path)
    if out == 'published':
        (tmp_path / 'published').mkdir()
    final = publish_model.publish(str(tmp_path / 'runs' / 'epoch_20.pth'), out)
    folder = tmp_path if out == '.' else tmp_path / 'published'
    assert osp.dirname(osp.abspath(final)) == str(folder)
    assert osp.basename(final) == f'epoch_20-{digest(final)[:8]}.pth'
