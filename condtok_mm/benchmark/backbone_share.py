"""The conditioner's share of a backbone's training step (forward + backward), with only torch and timm installed.

    python tools/benchmark/backbone_share.py [--device cuda] [--batch 2] [--repeats 20] [--out-dir DIR]

mmdet's backbones cannot be imported without mmcv's compiled ops (mmdet.models imports them all), so the backbones
are timm's builds of the same architectures: Swin-T (``swin_tiny_patch4_window7_224``: embed 96, depths 2-2-6-2,
window 7, padded to whole windows as mmdet's is) on an 800 x 1344 batch (200 x 336 patches, d 96), and ViTDet-B's
(``samvit_base_patch16``, SAM's image encoder: ViT-B/16 with 14 x 14 windows, global attention in blocks 2, 5, 8, 11
and relative positions, as ViTDet-B) on 1024 x 1024 (64 x 64 patches, d 768), both without heads or necks, random
weights. The conditioned twin conditions the patch embedding's output grid (before any position embedding, this
package's default) by a forward hook running :func:`condtok_mm.conditioning.condition_valid_regions` on a padded
batch's valid sizes (the odd images' 3/4 x 2/3 of the grid), C a constant in backward.

Per backbone, precision (float32, bf16 autocast) and solver: the plain and conditioned steps' ms (CUDA events on a
GPU, wall time on the CPU; median of --repeats after warm-up), their difference over the plain step (the
conditioner's share of the backbone step, an upper bound of its share of the detector's step), and the conditioner
called alone on the same tokens (its ms over the plain step). Prints the table, writes backbone_share.json and
backbone_share.png.
"""
import argparse
import json
import os
import os.path as osp
import statistics
import sys

import torch

from condtok_mm import conditioning
from .conditioner_cuda import times_ms

# name: (timm model, its keyword arguments, image size (H, W) of the full-size benchmark)
BACKBONES = {
    'Swin-T': ('swin_tiny_patch4_window7_224', dict(strict_img_size=False), (800, 1344)),
    'ViTDet-B': ('samvit_base_patch16', dict(neck_chans=0), (1024, 1024)),
}


def build(name: str, size, device: str) -> torch.nn.Module:
    import timm
    model_name, kwargs, _ = BACKBONES[name]
    return timm.create_model(model_name, pretrained=False, num_classes=0, global_pool='', img_size=size,
                             **kwargs).to(device)


def valid_sizes(batch: int, height: int, width: int, device: str) -> torch.Tensor:
    return torch.tensor([[height, width] if b % 2 == 0 else [height * 3 // 4, width * 2 // 3] for b in range(batch)],
                        device=device)


def conditioning_hook(options):
    """A forward hook on the patch embedding: its (B, H, W, d) output conditioned on each image's valid region."""
    def hook(module, args, grid):
        return conditioning.condition_valid_regions(grid, valid_sizes(grid.shape[0], *grid.shape[1:3], grid.device),
                                                    options=options)
    return hook


def measure(name: str, size, batch: int, repeats: int, device: str, precisions, solvers):
    torch.manual_seed(0)
    model = build(name, size, device).train()
    images = torch.randn(batch, 3, *size, device=device)
    rows = []
    for precision in precisions:
        autocast = torch.autocast(device, dtype=torch.bfloat16, enabled=precision == 'bf16')

        def step():
            model.zero_grad(set_to_none=True)
            with autocast:
                features = model.forward_features(images)
            features.float().square().mean().backward()

        plain = times_ms(step, repeats, device)
        with torch.no_grad(), autocast:
            tokens = model.patch_embed(images)
        for solver in solvers:
            options = conditioning.ConditioningOptions(solver=solver, where=f'{name} patch_embed')
            handle = model.patch_embed.register_forward_hook(conditioning_hook(options))
            try:
                conditioned = times_ms(step, repeats, device)
            finally:
                handle.remove()
            sizes = valid_sizes(batch, *tokens.shape[1:3], device)
            with torch.no_grad():
                alone = times_ms(lambda: conditioning.condition_valid_regions(tokens, sizes, options=options), repeats,
                              device)
            plain_ms, conditioned_ms, alone_ms = (statistics.median(t) for t in (plain, conditioned, alone))
            rows.append(dict(backbone=name, image=list(size), tokens=list(tokens.shape[1:]), token_dtype=str(
                tokens.dtype).split('.')[1], batch=batch, precision=precision, solver=solver, plain_ms=plain_ms,
                conditioned_ms=conditioned_ms, conditioner_alone_ms=alone_ms,
                step_share=(conditioned_ms - plain_ms) / plain_ms, alone_share=alone_ms / plain_ms,
                plain_times_ms=plain, conditioned_times_ms=conditioned, alone_times_ms=alone))
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu', choices=['cpu', 'cuda'])
    parser.add_argument('--backbones', nargs='+', default=list(BACKBONES), choices=list(BACKBONES))
    parser.add_argument('--size', type=int, nargs=2, metavar=('H', 'W'),
                        help='one image size for every backbone (default: each backbone\'s full size)')
    parser.add_argument('--batch', type=int, default=2)
    parser.add_argument('--repeats', type=int, default=20, help='timed steps per variant (default: 20)')
    parser.add_argument('--precisions', nargs='+', default=['float32', 'bf16'], choices=['float32', 'bf16'])
    parser.add_argument('--solvers', nargs='+', default=['newton_schulz', 'eigh'], choices=['newton_schulz', 'eigh'])
    parser.add_argument('--out-dir', default='work_dirs/backbone_share')
    args = parser.parse_args(argv)
    from tqdm import tqdm
    rows = []
    for name in tqdm(args.backbones, desc='backbones', file=sys.stderr):
        size = tuple(args.size) if args.size else BACKBONES[name][2]
        rows += measure(name, size, args.batch, args.repeats, args.device, args.precisions, args.solvers)
    print(f'{"backbone":>9} {"image":>10} {"prec.":>7} {"solver":>14} {"plain ms":>9} {"cond. ms":>9} '
          f'{"share":>7} {"alone ms":>9} {"alone/step":>10}')
    for row in rows:
        print(f'{row["backbone"]:>9} {"x".join(map(str, row["image"])):>10} {row["precision"]:>7} {row["solver"]:>14} '
              f'{row["plain_ms"]:9.2f} {row["conditioned_ms"]:9.2f} {100 * row["step_share"]:6.2f}% '
              f'{row["conditioner_alone_ms"]:9.3f} {100 * row["alone_share"]:9.2f}%')
    import timm
    machine = dict(device=torch.cuda.get_device_name(0) if args.device == 'cuda' else 'cpu', torch=torch.__version__,
                   cuda=torch.version.cuda, timm=timm.__version__)
    os.makedirs(args.out_dir, exist_ok=True)
    with open(osp.join(args.out_dir, 'backbone_share.json'), 'w') as f:
        json.dump(dict(command='python tools/benchmark/backbone_share.py ' + ' '.join(argv or sys.argv[1:]),
                       machine=machine, rows=rows), f, indent=1)
    plot(rows, osp.join(args.out_dir, 'backbone_share.png'))
    print(f'wrote backbone_share.json and backbone_share.png in {args.out_dir}')


def plot(rows, path):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    figure, axis = plt.subplots(figsize=(7, 3.5))
    labels = [f'{r["backbone"]}\n{r["precision"]}, {r["solver"]}' for r in rows]
    positions = range(len(rows))
    axis.bar([p - 0.2 for p in positions], [100 * r['step_share'] for r in rows], 0.4, label='step (conditioned - plain)')
    axis.bar([p + 0.2 for p in positions], [100 * r['alone_share'] for r in rows], 0.4, label='conditioner alone')
    axis.set_xticks(list(positions), labels, fontsize=6)
    axis.set_ylabel('% of the plain backbone step')
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


if __name__ == '__main__':
    main()
