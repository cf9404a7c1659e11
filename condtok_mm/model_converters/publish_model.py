"""Publish a training checkpoint as mmdet's tools/model_converters/publish_model.py does: keep only the weights and
their meta (no optimizer, scheduler or message hub), and put the first 8 hex digits of the file's SHA-256 in its
name, so that a config naming the file names its content.

    python tools/model_converters/publish_model.py IN_FILE OUT_FILE [--save-keys meta state_dict]
    # OUT_FILE=a/swin-mini_shapes-cls.pth -> a/swin-mini_shapes-cls-1a2b3c4d.pth (printed)
    # OUT_FILE=a/ (a folder: ends with a slash, or exists) -> a/epoch_12-1a2b3c4d.pth for IN_FILE=.../epoch_12.pth

OUT_FILE itself is never written, and no existing file is replaced: IN_FILE (even given as OUT_FILE) and other
checkpoints stay as they are.

The checkpoint is read through mmengine's loader with condtok_mm.compat's weights-only unpickler (nothing in it can
run code). The demo protocol study pretrains its backbones once and loads these files
(docs/en/user_guides/protocols.md).
"""
import argparse
import hashlib
import os
import os.path as osp
import sys
import tempfile

import torch

from condtok_mm import compat


def published_stem(in_file, out_file):
    """The path the SHA-256 prefix is appended to: ``out_file`` without .pth, or, where ``out_file`` names a folder
    (it ends with a slash, or is a folder that exists), ``in_file``'s name in that folder, as cp and mv read a
    folder."""
    if osp.basename(out_file) in ('', '.', '..') or osp.isdir(out_file):  # 'dir/', '.', '..', an existing folder
        out_file = osp.join(out_file, osp.basename(in_file))
    return out_file[:-len('.pth')] if out_file.endswith('.pth') else out_file


def cannot_write(folder, error, fix):
    """The OSError (of ``error``'s kind) that says why ``folder`` could not be written, and ``fix``."""
    return type(error)(f'cannot write into {folder} ({error.strerror or error}): {fix}')


def temporary_in(folder):
    """(file descriptor, path) of a new temporary file in ``folder`` (made where missing); an OSError naming the
    folder and the fix where it cannot be made or written."""
    try:
        os.makedirs(folder, exist_ok=True)
        return tempfile.mkstemp(prefix='.publish-', suffix='.pth', dir=folder)
    except (FileExistsError, NotADirectoryError):  # makedirs met a file on the way
        raise NotADirectoryError(f'{folder} cannot be a folder: a part of that path is a file. Give an OUT_FILE in '
                                 'a folder') from None
    except OSError as error:  # read-only, or another user's
        raise cannot_write(folder, error, 'give an OUT_FILE in a folder you can write to') from None


def kind_of(path):
    """What the name ``path``, taken by something that is not a regular file, holds."""
    if osp.islink(path) and not osp.exists(path):
        return f'a symbolic link to {os.readlink(path)}, which does not exist'
    return 'a folder' if osp.isdir(path) else 'not a regular file'


def publish(in_file, out_file, save_keys=('meta', 'state_dict')):
    """Write ``in_file``'s ``save_keys`` to ``out_file`` with the SHA-256 prefix in its name; returns that path.
    An ``out_file`` that names a folder (``dir/``) stands for ``in_file``'s name in it.

    Nothing is overwritten: the file is written under a temporary name in the target folder and linked to its
    final name only where no file has it (the same content already published there is left as it is), so neither
    ``in_file`` nor another checkpoint can be lost, and an interrupted run leaves no half-written file."""
    from mmengine.runner.checkpoint import CheckpointLoader
    compat.apply()
    checkpoint = CheckpointLoader.load_checkpoint(in_file, map_location='cpu')
    if not isinstance(checkpoint, dict):
        raise ValueError(f'{in_file} holds a {type(checkpoint).__name__}, not a checkpoint dict')
    missing = [key for key in save_keys if key not in checkpoint]
    if missing:
        raise KeyError(f'{in_file} has no {", ".join(missing)} (it has {", ".join(checkpoint)}); give --save-keys '
                       'from those')
    published = {key: checkpoint[key] for key in save_keys}
    stem = published_stem(in_file, out_file)
    folder = osp.dirname(osp.abspath(stem))
    handle, temporary = temporary_in(folder)
    try:
        try:
            with os.fdopen(handle, 'wb') as f:
                torch.save(published, f)
        except OSError as error:  # a full disk, a quota
            raise cannot_write(folder, error, 'give an OUT_FILE in a folder with room for the checkpoint') from None
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temporary, 0o666 & ~umask)  # as a plain open() would create it (mkstemp makes it private)
        with open(temporary, 'rb') as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        final = f'{stem}-{digest[:8]}.pth'
        try:
            os.link(temporary, final)  # fails where the name is taken: never replaces a file
        except FileExistsError:
            if not osp.isfile(final):
                raise FileExistsError(f'{final} exists and is {kind_of(final)}; it is left as it is: give another '
                                      'OUT_FILE, or remove it') from None
            with open(final, 'rb') as f:
                if hashlib.sha256(f.read()).hexdigest() != digest:
                    raise FileExistsError(f'{final} exists and holds something else; it is left as it is: give '
                                          'another OUT_FILE') from None
        except OSError as error:  # e.g. a file system without hard links, which the no-overwrite write needs
            raise FileExistsError(f'cannot write {final} without risking an existing file ({error}); give an '
                                  'OUT_FILE on a local file system') from None
    finally:
        os.unlink(temporary)
    return final


def main(argv=None):
    parser = argparse.ArgumentParser(description='Keep a checkpoint\'s weights and meta, named by their SHA-256')
    parser.add_argument('in_file', help='a training checkpoint (epoch_N.pth)')
    parser.add_argument('out_file', help='where to write it; the SHA-256 prefix goes before .pth (a folder, DIR/: '
                        'IN_FILE\'s name in it)')
    parser.add_argument('--save-keys', nargs='+', default=['meta', 'state_dict'],
                        help='the top-level keys kept (default: meta state_dict)')
    args = parser.parse_args(argv)
    if not osp.exists(args.in_file):
        parser.error(f'{args.in_file} does not exist')
    try:
        print(publish(args.in_file, args.out_file, args.save_keys))
    except (ValueError, KeyError, OSError, compat.UnsafeCheckpointError) as error:  # UnreadableCheckpointError too
        sys.exit(f'error: {error}')


if __name__ == '__main__':
    main()
