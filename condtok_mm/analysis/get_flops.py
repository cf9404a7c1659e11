"""FLOPs of detectors (and classifiers) with the token conditioner counted, e.g. a baseline and its conditioned twin.

mmdet's tools/analysis_tools/get_flops.py counts torch.linalg.eigh and torch.linalg.svd as 0; here they are
counted (condtok_mm.utils.flops), and the conditioner's share is reported. One random image of the given size
(padded as the config's data preprocessor pads), the model in eval mode, multiply-adds as in mmengine.

    python tools/analysis/get_flops.py configs/swin/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py \
        configs/swin/mask-rcnn_swin-t-p4-w7-condtok_fpn_1x_coco.py --shape 800 1333
"""
import argparse
import json
import os
import os.path as osp
from functools import partial

import torch
from mmengine.config import Config, DictAction
from mmengine.registry import init_default_scope

import condtok_mm  # noqa: F401  (registration)
from condtok_mm.registry import MODELS
from condtok_mm.utils import describe_machine
from condtok_mm.utils.flops import count_flops


def parse_args():
    parser = argparse.ArgumentParser(description='FLOPs with the conditioner (eigh, SVD) counted')
    parser.add_argument('configs', nargs='+', help='config files, e.g. a baseline and its conditioned twin')
    parser.add_argument('--shape', type=int, nargs=2, default=[800, 1333], metavar=('H', 'W'),
                        help='input image size before padding (default: 800 1333)')
    parser.add_argument('--out', help='write the numbers to this JSON file')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override settings of every config, as in tools/train.py')
    return parser.parse_args()


def model_inputs(cfg: Config, height: int, width: int):
    """The model, in eval mode, and the inputs of one random (1, 3, H, W) image, padded as the config pads."""
    init_default_scope(cfg.get('default_scope', 'mmdet'))
    model = MODELS.build(cfg.model)
    model.eval()
    divisor = cfg.model.get('data_preprocessor', {}).get('pad_size_divisor', 1)
    padded = (-(-height // divisor) * divisor, -(-width // divisor) * divisor)
    image = torch.randn(1, 3, *padded, generator=torch.Generator().manual_seed(0))
    if cfg.get('default_scope', 'mmdet') == 'mmdet':  # detectors need the image's meta information
        from mmdet.structures import DetDataSample
        sample = DetDataSample(metainfo=dict(img_shape=(height, width), ori_shape=(height, width),
                                             pad_shape=padded, batch_input_shape=padded, scale_factor=(1., 1.)))
        model.forward = partial(model.forward, data_samples=[sample], mode='tensor')
    else:  # mmpretrain classifiers
        model.forward = partial(model.forward, mode='tensor')
    return model, (image, ), padded


def main():
    args = parse_args()
    height, width = args.shape
    rows = []
    for path in args.configs:
        cfg = Config.fromfile(path)
        if args.cfg_options:
            cfg.merge_from_dict(args.cfg_options)
        model, inputs, padded = model_inputs(cfg, height, width)
        with torch.no_grad():
            flops = count_flops(model, inputs)
        rows.append(dict(config=path, input=list(padded), params=sum(p.numel() for p in model.parameters()),
                         **flops))

    print(f'FLOPs = multiply-adds (mmengine\'s convention), one {height}x{width} image; '
          'eigh and SVD counted (condtok_mm.utils.flops)')
    print('| config | input | params | GFLOPs | backbone | conditioner | of which eigh/SVD | conditioner share |')
    print('|---|---|---|---|---|---|---|---|')
    for row in rows:
        print(f'| {osp.basename(row["config"])} | {row["input"][0]}x{row["input"][1]} | {row["params"] / 1e6:.2f} M '
              f'| {row["total"] / 1e9:.2f} | {row["by_module"].get("backbone", 0) / 1e9:.2f} '
              f'| {row["conditioner"] / 1e9:.3f} | {row["decompositions"] / 1e9:.3f} '
              f'| {100 * row["conditioner"] / row["total"]:.2f} % |')
    if args.out:
        os.makedirs(osp.dirname(osp.abspath(args.out)), exist_ok=True)
        with open(args.out, 'w') as f:
            json.dump(dict(machine=describe_machine(), shape=[height, width], results=rows), f, indent=2)
        print(f'written: {args.out}')


if __name__ == '__main__':
    main()
