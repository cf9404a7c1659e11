"""Publish a training checkpoint as mmdet's tools/model_converters/publish_model.py does: keep only the weights and
their meta (no optimizer, scheduler or message hub), and put the first 8 hex digits of the file's SHA-256 in its
name, so that a config naming the file names its content.

    python tools/model_converters/publish_model.py IN_FILE OUT_FILE [--save-keys meta state_dict]
    # OUT_FILE=a/swin-mini_shapes-cls.pth -> a/swin-mini_shapes-cls-1a2b3c4d.pth (printed)

The checkpoint is read through mmengine's loader with condtok_mm.compat's weights-only unpickler (nothing in it can
run code). The demo protocol study pretrains its backbones once and loads these files
(docs/en/user_guides/protocols.md).
"""
import argparse
import hashlib
import os
import os.path as osp
import sys

import torch

sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))
from condtok_mm import compat  # noqa: E402


def publish(in_file, out_file, save_keys=('meta', 'state_dict')):
    """Write ``in_file``'s ``save_keys`` to ``out_file`` with the SHA-256 prefix in its name; returns that path."""
    from mmengine.runner.checkpoint import CheckpointLoader
    compat.apply()
    checkpoint = CheckpointLoader.load_checkpoint(in_file, map_location='cpu')
    missing = [key for key in save_keys if key not in checkpoint]
    if missing:
        raise KeyError(f'{in_file} has no {", ".join(missing)} (it has {", ".join(checkpoint)}); give --save-keys '
                       'from those')
    published = {key: checkpoint[key] for key in save_keys}
    os.makedirs(osp.dirname(osp.abspath(out_file)), exist_ok=True)
    torch.save(published, out_file)
    with open(out_file, 'rb') as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    stem = out_file[:-len('.pth')] if out_file.endswith('.pth') else out_file
    final = f'{stem}-{digest[:8]}.pth'
    os.replace(out_file, final)
    return final


def main(argv=None):
    parser = argparse.ArgumentParser(description='Keep a checkpoint\'s weights and meta, named by their SHA-256')
    parser.add_argument('in_file', help='a training checkpoint (epoch_N.pth)')
    parser.add_argument('out_file', help='where to write it; the SHA-256 prefix goes before .pth')
    parser.add_argument('--save-keys', nargs='+', default=['meta', 'state_dict'],
                        help='the top-level keys kept (default: meta state_dict)')
    args = parser.parse_args(argv)
    if not osp.isfile(args.in_file):
        parser.error(f'{args.in_file} is not a file')
    print(publish(args.in_file, args.out_file, args.save_keys))


if __name__ == '__main__':
    main()
