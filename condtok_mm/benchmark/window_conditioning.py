"""Cost of per-window against whole-image conditioning of embedded tokens.

    python tools/benchmark/window_conditioning.py [--batch 2] [--repeats 5] [--threads N] [--device cpu]
        [--scale 1.0] [--out-dir work_dirs/benchmark/]

Times TokenConditioner(scope='image') and TokenConditioner(scope='window') on the patch-embedding tokens of
  * Swin-T stage 0 at 800 x 1333 (a 200 x 334 grid of 96 channels, 7 x 7 windows), and
  * ViTDet ViT-B at 1024 x 1024 (a 64 x 64 grid of 768 channels, 14 x 14 windows),
made by randomly initialized patch embeddings (mmdet's Swin PatchEmbed with its LayerNorm, ViTDet's strided
conv) from smooth random images, so the token matrices have the rank structure of real ones (LayerNorm'd
Swin tokens are rank-deficient), and on ViT-B tokens of an image that fills only a quarter of the canvas,
the rest padded in gray as large-scale jitter does (windows of identical tokens). Prints a table, checks
the bound (largest kappa over images or windows), and writes window_conditioning.json and
window_conditioning.png to --out-dir, with the machine it ran on.
"""
import argparse
import json
import os
import os.path as osp
import statistics

import torch
import torch.nn.functional as F
from tqdm import tqdm

import condtok_mm  # noqa: F401  (registration)
from condtok_mm.conditioning import condition_number
from condtok_mm.models.backbones.vitdet_vit import ViTDetPatchEmbed
from condtok_mm.registry import MODELS
from condtok_mm.utils import describe_machine, machine_summary, timed

CASES = [
    dict(model='Swin-T stage 0', image=(800, 1333), window_size=7, embed='swin-t', content=1.0),
    dict(model='ViT-B', image=(1024, 1024), window_size=14, embed='vit-b', content=1.0),
    # large-scale jitter shrinks many training images to a corner of the 1024 canvas and pads the rest with
    # one gray: the windows there hold identical tokens (rank 1), the costliest case for the Gram path
    dict(model='ViT-B', suffix=' LSJ 0.5', image=(1024, 1024), window_size=14, embed='vit-b', content=0.5),
]


def parse_args():
    parser = argparse.ArgumentParser(description='Per-window vs whole-image token conditioning cost')
    parser.add_argument('--batch', type=int, default=2, help='images per batch')
    parser.add_argument('--repeats', type=int, default=5, help='timed runs per measurement')
    parser.add_argument('--warmup', type=int, default=1, help='untimed runs before them')
    parser.add_argument('--threads', type=int, default=None, help='torch CPU threads (default: torch\'s)')
    parser.add_argument('--device', default='cpu', help="'cpu' or 'cuda'")
    parser.add_argument('--mode', default='sigma_max', help='conditioning mode')
    parser.add_argument('--out-dir', default='work_dirs/benchmark/', help='where to write JSON and PNG')
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--scale', type=float, default=1.0,
                        help='image sizes times this (the tests run the script at a small fraction)')
    return parser.parse_args()


def smooth_images(batch, size, generator):
    """Images with structure at several scales (not white noise), in [0, 1]."""
    image = torch.zeros(batch, 3, *size)
    for scale in (8, 32, 128):
        coarse = torch.rand(batch, 3, max(1, size[0] // scale), max(1, size[1] // scale), generator=generator)
        image += F.interpolate(coarse, size=size, mode='bilinear', align_corners=False)
    return image / 3


@torch.no_grad()
def make_tokens(case, image_size, batch, generator):
    """(B, H*W, C) patch-embedding tokens of images of ``image_size`` and their grid (H, W)."""
    images = torch.full((batch, 3, *image_size), 114 / 255)
    height, width = (round(case['content'] * side) for side in image_size)
    images[:, :, :height, :width] = smooth_images(batch, (height, width), generator)
    if case['embed'] == 'swin-t':  # 4 x 4 patches, 96 channels, LayerNorm
        from mmdet.models.layers.transformer.utils import PatchEmbed
        embed = PatchEmbed(3, 96, kernel_size=4, stride=4, norm_cfg=dict(type='LN'))
        tokens, hw_shape = embed(images)
    else:  # ViTDet ViT-B: 16 x 16 patches, 768 channels, no norm
        grid = ViTDetPatchEmbed(16, 3, 768)(images)
        hw_shape = tuple(grid.shape[1:3])
        tokens = grid.reshape(batch, -1, grid.shape[-1])
    return tokens.contiguous(), tuple(hw_shape)


def windows_of(tokens, hw_shape, window_size):
    """Every window's token matrix (its real tokens: windows at the border are cut), for the bound check."""
    grid = tokens.view(tokens.shape[0], *hw_shape, -1)
    for top in range(0, hw_shape[0], window_size):
        for left in range(0, hw_shape[1], window_size):
            window = grid[:, top:top + window_size, left:left + window_size]
            yield window.reshape(tokens.shape[0], -1, tokens.shape[-1])


def time_it(fn, warmup, repeats, device, progress):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        seconds, out = timed(fn, device)
        times.append(seconds)
        progress.update(1)
    return out, times


def plot(results, machine, path):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.38
    for i, result in enumerate(results):
        for j, scope in enumerate(('image', 'window')):
            ms = result[f'{scope}_ms_median']
            ax.bar(i + (j - 0.5) * width, ms, width, color=('tab:blue', 'tab:orange')[j],
                   label=f'per {scope}' if i == 0 else None)
            ax.text(i + (j - 0.5) * width, ms, f'{ms:.0f}', ha='center', va='bottom', fontsize=8)
    ax.set_xticks(range(len(results)), [f'{r["case"]}\n{r["windows_per_image"]} windows/image\n'
                                        f'window / image: {r["ratio"]:.2f}x' for r in results], fontsize=8)
    ax.set_ylabel(f'ms per batch of {results[0]["batch"]} (median)')
    ax.set_ylim(0, max(max(r['image_ms_median'], r['window_ms_median']) for r in results) * 1.25)
    ax.set_title(f'Token conditioning cost: {machine["device"]}, {machine["torch_threads"]} threads\n'
                 f'{machine["gpu"] or machine["cpu"]}', fontsize=9)
    ax.legend(loc='upper left', ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main():
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    generator = torch.Generator().manual_seed(args.seed)
    torch.manual_seed(args.seed)
    machine = describe_machine(device)
    results = []
    progress = tqdm(total=2 * args.repeats * len(CASES), desc='conditioning', unit='run')
    for case in CASES:
        image_size = tuple(round(args.scale * side) for side in case['image'])
        tokens, hw_shape = make_tokens(case, image_size, args.batch, generator)
        tokens = tokens.to(device)
        name = f'{case["model"]}, {image_size[0]}x{image_size[1]}{case.get("suffix", "")}'
        result = dict(case=name, batch=args.batch, grid=list(hw_shape), channels=tokens.shape[-1],
                      window_size=case['window_size'], mode=args.mode,
                      windows_per_image=len(list(windows_of(tokens[:1], hw_shape, case['window_size']))))
        for scope in ('image', 'window'):
            window = dict(window_size=case['window_size']) if scope == 'window' else {}
            conditioner = MODELS.build(dict(type='TokenConditioner', mode=args.mode, scope=scope, **window))
            with torch.no_grad():
                out, times = time_it(lambda: conditioner(tokens, hw_shape=hw_shape), args.warmup, args.repeats,
                                     device, progress)
            matrices = [out] if scope == 'image' else list(windows_of(out, hw_shape, case['window_size']))
            result[f'{scope}_ms_median'] = 1000 * statistics.median(times)
            result[f'{scope}_ms_min'] = 1000 * min(times)
            result[f'{scope}_ms_all'] = [round(1000 * t, 1) for t in times]
            result[f'{scope}_max_kappa_after'] = max(float(condition_number(m.cpu()).max()) for m in matrices)
        result['ratio'] = result['window_ms_median'] / result['image_ms_median']
        results.append(result)
    progress.close()
    if hasattr(os, 'getloadavg'):  # other processes on the machine skew the times; say how busy it was
        machine['load_average_at_end'] = [round(v, 2) for v in os.getloadavg()]

    header = (f'{"case":<26} {"tokens (B x H x W x C)":<24} {"windows":>8} {"image ms":>10} {"window ms":>10} '
              f'{"ratio":>6} {"max kappa image/window":>23}')
    print(header)
    print('-' * len(header))
    for r in results:
        tokens = f'{r["batch"]} x {r["grid"][0]} x {r["grid"][1]} x {r["channels"]}'
        print(f'{r["case"]:<26} {tokens:<24} {r["windows_per_image"]:>8} {r["image_ms_median"]:>10.1f} '
              f'{r["window_ms_median"]:>10.1f} {r["ratio"]:>6.2f} '
              f'{r["image_max_kappa_after"]:>11.4f} / {r["window_max_kappa_after"]:.4f}')
    print(f'machine: {machine_summary(machine)}; load average {machine["load_average"]} before, '
          f'{machine.get("load_average_at_end")} after')

    os.makedirs(args.out_dir, exist_ok=True)
    json_path = osp.join(args.out_dir, 'window_conditioning.json')
    with open(json_path, 'w') as f:
        json.dump(dict(machine=machine, settings=vars(args), results=results), f, indent=2)
    png_path = osp.join(args.out_dir, 'window_conditioning.png')
    plot(results, machine, png_path)
    print(f'wrote {json_path} and {png_path}')


if __name__ == '__main__':
    main()
