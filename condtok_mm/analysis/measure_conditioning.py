"""Measure kappa of the embedded tokens and of every attention layer on a config's val images.

    python tools/analysis/measure_conditioning.py CONFIG [CHECKPOINT] [--num-images 50] [--out-dir DIR]

Prints a per-layer table (with a progress bar while it runs) and writes measure_conditioning.json and
measure_conditioning.png to --out-dir (default: the checkpoint's folder, or work_dirs/<config name>).
Without CHECKPOINT the backbone keeps its constructor's initialization (nothing is downloaded).
"""
import argparse
import json
import os
import os.path as osp
import sys

import matplotlib
import torch
from mmengine.config import Config, DictAction
from mmengine.registry import init_default_scope
from mmengine.runner import Runner, load_checkpoint
from tqdm import tqdm

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402

import condtok_mm  # noqa: F401  (registration)
from condtok_mm import compat
from condtok_mm.engine.hooks.kappa_probe import KappaProbe
from condtok_mm.models.valid_region import record_valid_region
from condtok_mm.registry import MODELS
from condtok_mm.utils import DatasetNotFoundError, check_dataset_files, describe_machine


def parse_args():
    parser = argparse.ArgumentParser(description='Measure kappa of tokens and attention on val images')
    parser.add_argument('config', help='config file')
    parser.add_argument('checkpoint', nargs='?', help='checkpoint (default: untrained weights)')
    parser.add_argument('--num-images', type=int, default=50, help='val images to run')
    parser.add_argument('--max-matrices', type=int, default=32,
                        help='attention matrices per layer and batch used for kappa')
    parser.add_argument('--out-dir', help='where the JSON and PNG go')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction, help='override config settings')
    return parser.parse_args()


def measure(cfg, checkpoint, num_images, max_matrices):
    init_default_scope(cfg.get('default_scope', 'mmdet'))
    model = MODELS.build(cfg.model)
    if checkpoint:
        load_checkpoint(model, checkpoint, map_location='cpu')
    model.eval()
    probe = KappaProbe(model.backbone, max_matrices=max_matrices)
    loader_cfg = cfg.val_dataloader.copy()
    loader_cfg.update(num_workers=0, persistent_workers=False)
    loader = Runner.build_dataloader(loader_cfg)
    seen = 0
    with torch.no_grad(), tqdm(total=num_images, desc='measuring kappa', unit='img') as bar:
        for batch in loader:
            data = model.data_preprocessor(batch, False)
            take = min(num_images - seen, data['inputs'].shape[0])
            inputs = data['inputs'][:take]
            # every image measured on its own valid tokens, whatever preprocessor the config has
            record_valid_region(inputs, [sample.img_shape for sample in data['data_samples'][:take]])
            probe.active = True
            model.backbone(inputs)
            probe.active = False
            seen += take
            bar.update(take)
            if seen >= num_images:
                break
    return probe.reduce(), seen


def table(scalars):
    """One row per quantity and place: kappa/* are condition numbers, scale/correction is ||X + C|| / ||X||."""
    rows = sorted({(k.split('/')[0], k.split('/')[1].rsplit('_', 1)[0], k.split('/')[2]) for k in scalars})
    lines = [f'{"quantity":<24} {"where":<8} {"mean":>12} {"max":>12}']
    for family, quantity, where in rows:
        lines.append(f'{family + "/" + quantity:<24} {where:<8} {scalars[f"{family}/{quantity}_mean/{where}"]:12.4g} '
                     f'{scalars[f"{family}/{quantity}_max/{where}"]:12.4g}')
    return '\n'.join(lines)


def plot(scalars, title, out):
    quantities = ['attn_softmax', 'attn_out', 'w_q', 'w_k', 'w_v']
    layers = sorted({k.split('/')[2] for k in scalars if k.startswith('kappa/attn_out_mean/')})
    fig, (ax_tokens, ax_layers) = plt.subplots(1, 2, figsize=(15, 5), width_ratios=[1, 3],
                                               constrained_layout=True)
    stages = sorted({k.split('/')[2] for k in scalars if k.startswith('kappa/tokens_in_mean/')})
    token_quantities = ('tokens_in', 'tokens_out', 'attn_input_centred')
    width = 0.8 / len(token_quantities)
    for q_index, quantity in enumerate(token_quantities):
        ax_tokens.bar([i + (q_index - len(token_quantities) / 2 + 0.5) * width for i in range(len(stages))],
                      [scalars.get(f'kappa/{quantity}_mean/{s}', float('nan')) for s in stages], width,
                      label=quantity)
    ax_tokens.set_xticks(range(len(stages)), stages)
    ax_tokens.set_title('tokens before / after the correction;\nfirst attention input (norm1, centred)')
    width = 0.8 / len(quantities)
    for q_index, quantity in enumerate(quantities):
        values = [scalars.get(f'kappa/{quantity}_mean/{layer}', float('nan')) for layer in layers]
        ax_layers.bar([i + (q_index - len(quantities) / 2 + 0.5) * width for i in range(len(layers))],
                      values, width, label=quantity)
    ax_layers.set_xticks(range(len(layers)), layers, rotation=45)
    ax_layers.set_title('attention layers (mean over heads, windows, images)')
    for ax in (ax_tokens, ax_layers):
        ax.set_yscale('log')
        ax.set_ylabel('kappa')
        ax.legend()
        ax.grid(True, axis='y', which='both', alpha=0.3)
    fig.suptitle(title)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main():
    args = parse_args()
    compat.apply()  # loads the checkpoint with the fixed local loader
    cfg = Config.fromfile(args.config)
    if args.cfg_options:
        cfg.merge_from_dict(args.cfg_options)
    try:
        check_dataset_files(cfg, splits=('val', ))
    except DatasetNotFoundError as error:
        sys.exit(f'error: {error}')
    out_dir = args.out_dir or (osp.dirname(args.checkpoint) if args.checkpoint else osp.join(
        'work_dirs', osp.splitext(osp.basename(args.config))[0]))
    os.makedirs(out_dir, exist_ok=True)
    scalars, seen = measure(cfg, args.checkpoint, args.num_images, args.max_matrices)
    print(table(scalars))
    result = dict(config=args.config, checkpoint=args.checkpoint, num_images=seen,
                  machine=describe_machine(),
                  kappa=scalars)
    with open(osp.join(out_dir, 'measure_conditioning.json'), 'w') as f:
        json.dump(result, f, indent=2)
    plot(scalars, f'{osp.basename(args.config)} ({seen} val images)',
         osp.join(out_dir, 'measure_conditioning.png'))
    print(f'wrote {osp.join(out_dir, "measure_conditioning.json")} and '
          f'{osp.join(out_dir, "measure_conditioning.png")}')


if __name__ == '__main__':
    main()
