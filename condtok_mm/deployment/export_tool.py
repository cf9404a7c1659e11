"""Export a config's conditioned backbone to ONNX, and check onnxruntime against PyTorch on it.

    python tools/deployment/export_onnx.py CONFIG [CHECKPOINT] --shape H W --backbone-only [--out-file FILE]
        [--verify] [--cfg-options KEY=VALUE ...]

The graph's input ``image`` is one normalized image (1, 3, H, W), what the config's data preprocessor hands the
backbone (mean and std applied, channels in its order); its outputs ``feat0``, ``feat1``, ... are the backbone's
feature maps. Every token of the input counts as valid: resize the image to H x W; padding inside the input would
be conditioned as part of the image (docs/en/user_guides/deployment.md). Conditioners with solver 'eigh' or 'auto'
are switched to 'newton_schulz', each with a line that says so. Without CHECKPOINT the backbone keeps its
constructor's initialization. ``--verify`` runs onnxruntime and PyTorch on one random image and prints, per output,
the largest difference relative to the largest value, beside PyTorch's own float32 error (against its float64
forward); it exits 1 past the tolerance (condtok_mm.deployment.parity).

Without --backbone-only the whole detector is tried, and the tool stops where torch's exporter stops on mmdet's
detector, printing where (docs/en/user_guides/deployment.md#the-whole-detector).
"""
import argparse
import os.path as osp
import sys

import torch
from mmengine.config import Config, DictAction
from mmengine.registry import init_default_scope
from mmengine.runner import load_checkpoint

import condtok_mm  # noqa: F401  (registration)
from condtok_mm import compat
from condtok_mm.registry import MODELS

def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='Export a conditioned backbone to ONNX')
    parser.add_argument('config', help='config file')
    parser.add_argument('checkpoint', nargs='?', help='checkpoint (default: the untrained backbone)')
    parser.add_argument('--shape', type=int, nargs=2, required=True, metavar=('H', 'W'),
                        help='the input size the graph is exported for (its shapes are static)')
    parser.add_argument('--backbone-only', action='store_true',
                        help='export the backbone (the supported route); without it the whole detector is tried')
    parser.add_argument('--out-file', help='the .onnx file (default: work_dirs/<config name>/<config name>_'
                        '{backbone,detector}_<H>x<W>.onnx)')
    parser.add_argument('--verify', action='store_true',
                        help='compare onnxruntime with PyTorch on a random image (exit 1 past the tolerance)')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction, help='override config settings')
    return parser.parse_args(argv)


def build_model(cfg: Config, checkpoint):
    """The config's model in eval mode, with the checkpoint's weights where one is given (weights-only)."""
    init_default_scope(cfg.get('default_scope', 'mmdet'))
    model = MODELS.build(cfg.model)
    if checkpoint:
        load_checkpoint(model, checkpoint, map_location='cpu')
    return model.eval()


def backbone_outputs(backbone: torch.nn.Module, image: torch.Tensor):
    """The backbone's feature maps as a list (mmdet backbones return a tuple, a list or one tensor)."""
    with torch.no_grad():
        out = backbone(image)
    return list(out) if isinstance(out, (tuple, list)) else [out]


def verify(path: str, backbone: torch.nn.Module, shape) -> bool:
    """Whether onnxruntime's outputs on one random image are within tolerance of PyTorch's, each output printed."""
    from condtok_mm.deployment.parity import output_parity
    image = torch.randn(1, 3, *shape, generator=torch.Generator().manual_seed(0))
    parity = output_parity(backbone, path, {'image': image})
    for index, output in enumerate(parity):
        print(f'feat{index} {output.shape}: max |onnxruntime - PyTorch| = {output.onnxruntime_vs_pytorch:.1e}, '
              f'PyTorch float32 vs float64 {output.float32_vs_float64:.1e} (relative to the largest feature; '
              f'tolerance {output.tolerance:.1e})')
    return all(output.within_tolerance for output in parity)


def main(argv=None):
    args = parse_args(argv)
    compat.apply()  # the checkpoint loads with the weights-only loader
    cfg = Config.fromfile(args.config)
    if args.cfg_options:
        cfg.merge_from_dict(args.cfg_options)
    from condtok_mm.deployment import export_onnx, use_exportable_solver
    model = build_model(cfg, args.checkpoint)
    name = osp.splitext(osp.basename(args.config))[0]
    part = 'backbone' if args.backbone_only else 'detector'
    out_file = args.out_file or osp.join('work_dirs', name, f'{name}_{part}_{args.shape[0]}x{args.shape[1]}.onnx')
    if not args.backbone_only:
        from condtok_mm.deployment.detector import export_detector
        sys.exit(export_detector(model, args.shape, out_file))
    backbone = model.backbone
    for message in use_exportable_solver(backbone):
        print(message)
    image = torch.zeros(1, 3, *args.shape)
    outputs = backbone_outputs(backbone, image)
    export_onnx(backbone, (image, ), out_file, ['image'], [f'feat{i}' for i in range(len(outputs))])
    print(f'exported {type(backbone).__name__} for a (1, 3, {args.shape[0]}, {args.shape[1]}) image to {out_file}; '
          'outputs ' + ', '.join(f'feat{i} {tuple(out.shape)}' for i, out in enumerate(outputs)))
    if args.verify and not verify(out_file, backbone, args.shape):
        print('onnxruntime differs from PyTorch by more than the tolerance')
        sys.exit(1)


if __name__ == '__main__':
    main()
