"""Convert an mmpretrain ViT classifier's checkpoint (configs/classification/vit-base-p16*_in1k.py, conditioned or
not) into the backbone checkpoint of our ViTDet detectors (configs/vitdet/: ViTDetViT / CondViT, MAE's key names).

    python tools/model_converters/mmpretrain_vit2vitdet.py SRC DST
    python tools/train.py configs/vitdet/mask-rcnn_vit-b-vitdet-condtok_simple-fpn_lsj-100e_coco.py \
        --cfg-options model.backbone.init_cfg.checkpoint=DST

Swin and XCiT need no conversion: mmpretrain's Swin has mmdet's Swin keys and our XCiT detectors wrap mmpretrain's
XCiT (their init_cfg reads the classifier's checkpoint as it is). CondTokBackbone keeps the wrapped backbone's
keys, so conditioned and unconditioned classifiers convert alike. The checkpoint is read through mmengine's loader
with condtok_mm.compat's weights-only unpickler (nothing in it can run code). Every backbone key is either mapped
or named in the error; the classifier's head and neck are left out.
"""
import argparse
import os.path as osp
import re
from collections import OrderedDict

import torch

from condtok_mm import compat

# mmpretrain VisionTransformer (under the classifier's 'backbone.') -> ViTDetViT / MAE
KEY_PATTERNS = [
    (r'cls_token', 'cls_token'),  # MAE's name; ViTDet does not use it
    (r'pos_embed', 'pos_embed'),
    (r'patch_embed\.projection\.(weight|bias)', r'patch_embed.proj.\1'),
    (r'layers\.(\d+)\.ln1\.(weight|bias)', r'blocks.\1.norm1.\2'),
    (r'layers\.(\d+)\.ln2\.(weight|bias)', r'blocks.\1.norm2.\2'),
    (r'layers\.(\d+)\.attn\.(qkv|proj)\.(weight|bias)', r'blocks.\1.attn.\2.\3'),
    (r'layers\.(\d+)\.ffn\.layers\.0\.0\.(weight|bias)', r'blocks.\1.mlp.fc1.\2'),
    (r'layers\.(\d+)\.ffn\.layers\.1\.(weight|bias)', r'blocks.\1.mlp.fc2.\2'),
    (r'ln1\.(weight|bias)', r'norm.\1'),  # the final norm (MAE's 'norm'); ViTDet does not use it
]
# the classifier's parts that are not the backbone
NOT_BACKBONE = ('head.', 'neck.', 'data_preprocessor.')


def convert_vit(state_dict: dict) -> 'OrderedDict[str, torch.Tensor]':
    """The ViTDet (MAE-named) state dict of an mmpretrain ImageClassifier's ViT backbone.

    Raises:
        ValueError: when the checkpoint has no ``backbone.`` key, or a backbone key this converter does not know
            (e.g. a ViT with layer scale or a pre-norm, which ViTDetViT does not have).
    """
    converted, unknown = OrderedDict(), []
    for key, value in state_dict.items():
        if key.startswith(NOT_BACKBONE):
            continue
        if not key.startswith('backbone.'):
            unknown.append(key)
            continue
        name = key[len('backbone.'):]
        for pattern, replacement in KEY_PATTERNS:
            if re.fullmatch(pattern, name):
                converted[re.sub(pattern, replacement, name)] = value
                break
        else:
            unknown.append(key)
    if unknown:
        raise ValueError(f'mmpretrain_vit2vitdet: keys that have no place in ViTDetViT: {unknown}; this converter '
                         "maps mmpretrain's VisionTransformer without layer scale or pre-norm")
    if not converted:
        raise ValueError("mmpretrain_vit2vitdet: the checkpoint has no 'backbone.' key: is it an mmpretrain "
                         'ImageClassifier checkpoint?')
    return converted


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description="Convert an mmpretrain ViT classifier checkpoint to ViTDet's keys")
    parser.add_argument('src', help='the mmpretrain checkpoint (e.g. work_dirs/vit-base-p16-condtok_64xb64_in1k/'
                        'epoch_300.pth)')
    parser.add_argument('dst', help='where to write the ViTDet backbone checkpoint')
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    compat.apply()
    from mmengine.runner import CheckpointLoader
    checkpoint = CheckpointLoader.load_checkpoint(args.src, map_location='cpu')
    converted = convert_vit(checkpoint.get('state_dict', checkpoint))
    torch.save(dict(state_dict=converted, meta=dict(converted_from=osp.abspath(args.src))), args.dst)
    print(f'wrote {len(converted)} ViTDet backbone tensors to {args.dst}')


if __name__ == '__main__':
    main()
