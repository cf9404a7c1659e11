"""How many attention windows of each layer are numerically singular in float32, in a trained cell's checkpoint.

    python tools/analysis/singular_attention.py CELL_DIR [CELL_DIR ...] --out-dir DIR [--split val]
        [--max-images N] [--checkpoint FILE]
    # e.g. CELL_DIR=work_dirs/suites/demo_confirm_swin/A_baseline/lr0.001/seed9 (a suite cell's work dir)

The model computes in float32. A float32 matrix whose condition number κ exceeds 1/u = 2**24 ≈ 1.68e7 (u = 2**-24,
float32's unit roundoff) has a smallest singular value below the rounding error of its largest: float32 cannot
tell it from a singular matrix, and its κ (float64 SVD of the float32 values, capped at 1e16) says nothing more.
AttentionKappaHook records the mean and max of κ over windows, which such windows set; this counts them instead.

Each CELL_DIR is a training run's work dir: the config mmengine dumped there (``<config name>.py``) and its final
checkpoint (the config's last epoch or iteration; --checkpoint names another file in the work dir). A suite cell's
record (suite_cell.json) holds the SHA-256 of the checkpoint the cell was tested with: a checkpoint whose SHA-256
differs is refused. Only the model and the dataloader are built from the config (not its hooks, so that configs
naming a hook this condtok_mm no longer registers load), on the CPU in eval mode, and the weights load with torch's
weights-only unpickler. The images of the config's --split dataloader (val unless told) go through the model's data
preprocessor and test_step with a KappaProbe on its backbone measuring every window and head, each image on its
valid tokens where the preprocessor records them (ValidRegionDetDataPreprocessor), as the hook does.

Per quantity (tokens per image; the first attention's input, softmax attention matrices and attention outputs per
window and head) it writes the number of matrices, how many and what share have κ > 2**24, and the median and
geometric mean κ of the others: one JSON per cell (<variant>_lr<rate>_seed<n>.json, or the dir's name), and
singular_attention.json, .md (per variant and rate the mean share over its seeds, with each seed's) and .png, which
cover every cell's JSON in --out-dir: cells measured on earlier runs into the same folder are kept in the table.
"""
import argparse
import glob
import json
import os
import os.path as osp
import sys
from typing import List, Optional

import matplotlib
import numpy as np
import torch
from mmengine.config import Config
from mmengine.registry import init_default_scope
from mmengine.runner import Runner, load_checkpoint
from tqdm import tqdm

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402

import condtok_mm  # noqa: F401  (registration)
from condtok_mm.compat.checkpoint_loading import (UnreadableCheckpointError, UnsafeCheckpointError,
                                                  weights_only_loading)
from condtok_mm.engine.hooks.kappa_probe import SINGULAR_KAPPA, KappaProbe
from condtok_mm.models.valid_region import ValidRegionDetDataPreprocessor
from condtok_mm.registry import MODELS
from condtok_mm.suites.fingerprint import FINGERPRINT_FILE, current_format, file_digest
from condtok_mm.suites.plan import final_checkpoint, lr_name
from condtok_mm.suites.results import UnreadableCellFile, read_json
from condtok_mm.utils import DatasetNotFoundError, check_dataset_files, describe_machine

# The KappaProbe quantities counted here (its w_q/w_k/w_v are weights, one per head, not windows), in the order of
# the forward pass, with what each matrix is.
QUANTITIES = {
    'tokens_in': 'embedded tokens X (per image)',
    'tokens_out': 'tokens entering the first block, X + C (per image)',
    'attn_input': "first attention's input, norm1 (per window)",
    'attn_input_centred': "first attention's input, norm1, centred (per window)",
    'attn_softmax': 'softmax attention matrix (per window and head)',
    'attn_out': 'attention output softmax(QK^T)V (per window and head)',
}
EVERY_MATRIX = sys.maxsize  # the probe's limits on matrices per layer and on their size: none


def summarise(kappas: np.ndarray) -> dict:
    """The count of matrices, how many and what share have κ > SINGULAR_KAPPA, and the median and geometric mean κ
    of the others (None where every matrix is singular).

    Args:
        kappas (np.ndarray): κ of each matrix (the probe's: float64, capped at 1e16).
    """
    singular = kappas > SINGULAR_KAPPA
    resolved = kappas[~singular]
    return dict(matrices=int(kappas.size), singular=int(singular.sum()),
                share=float(singular.mean()) if kappas.size else None,
                resolved_median=float(np.median(resolved)) if resolved.size else None,
                resolved_geomean=float(np.exp(np.log(resolved).mean())) if resolved.size else None)


def read_cell(cell_dir: str, checkpoint: Optional[str]) -> dict:
    """What a work dir holds for the measurement: its name, what its suite record says of it (None for a plain work
    dir), its dumped config (loaded) and its checkpoint with the SHA-256 checked against the record; raises
    ValueError naming what is missing or differs.

    Args:
        cell_dir (str): a training run's work dir.
        checkpoint (str, optional): the checkpoint's file name in the work dir; None: the config's final one.
    """
    if not osp.isdir(cell_dir):
        raise ValueError(f'{cell_dir} is not a directory: give the work dir of a training run (a suite cell\'s '
                         'work dir, e.g. work_dirs/suites/SUITE/VARIANT/lrRATE/seedN)')
    record_path = osp.join(cell_dir, FINGERPRINT_FILE)
    try:
        record = current_format(read_json(record_path), record_path) if osp.isfile(record_path) else None
    except UnreadableCellFile as error:
        raise ValueError(str(error)) from error
    named = record and record.get('config_file') and osp.join(cell_dir, osp.basename(record['config_file']))
    configs = [named] if named and osp.isfile(named) else sorted(glob.glob(osp.join(cell_dir, '*.py')))
    if len(configs) != 1:
        raise ValueError(f'{cell_dir} holds {len(configs)} config files ({", ".join(configs) or "none"}), not the one '
                         'that tools/train.py dumps into its work dir: give the work dir of a training run')
    cfg = Config.fromfile(configs[0])
    path = osp.join(cell_dir, checkpoint) if checkpoint else final_checkpoint(cfg, cell_dir)
    if not osp.isfile(path):
        raise ValueError(f'{path} does not exist: the training has not finished or its checkpoint was not kept (saved '
                         'suite records hold none); give the work dir of the run, or --checkpoint FILE in it')
    digest = file_digest(path, '.').split(':', 1)[1]
    if record is not None:
        if not record.get('checkpoint_sha256'):
            raise ValueError(f'{record_path} records no checkpoint SHA-256 (the cell has not been tested): test the '
                             'cell first, so that the checkpoint measured is the one it was tested with')
        if digest != record['checkpoint_sha256']:
            raise ValueError(f'{path} has SHA-256 {digest}, but {record_path} records {record["checkpoint_sha256"]} '
                             'for the checkpoint the cell was tested with: it was changed or replaced since; measure '
                             'the checkpoint the cell was tested with')
    name = (f'{record["variant"]}_{lr_name(record["lr"])}_seed{record["seed"]}'
            if record and None not in (record.get('variant'), record.get('lr'), record.get('seed'))
            else osp.basename(osp.normpath(cell_dir)))
    return dict(name=name, cell_dir=cell_dir, cfg=cfg, config=configs[0], checkpoint=path, checkpoint_sha256=digest,
                checked=record is not None, variant=record and record.get('variant'), lr=record and record.get('lr'),
                seed=record and record.get('seed'), commit=record and record.get('commit'))


def load_model(cfg: Config, checkpoint: str) -> torch.nn.Module:
    """The config's model on the CPU in eval mode with the checkpoint's weights (all of them, weights-only).

    Args:
        cfg (Config): the config whose ``model`` is built.
        checkpoint (str): the checkpoint's path.
    """
    init_default_scope(cfg.get('default_scope', 'mmdet'))
    model = MODELS.build(cfg.model)
    with weights_only_loading():
        try:
            load_checkpoint(model, checkpoint, map_location='cpu', strict=True)
        except RuntimeError as error:  # mmengine's error for missing, unexpected or misshapen weights
            raise ValueError(f'{checkpoint} does not hold the weights of the model its config builds: {error}') \
                from error
    return model.eval()


def build_loader(cfg: Config, split: str, max_images: Optional[int]):
    """The config's ``{split}_dataloader``, loading in this process.

    Args:
        cfg (Config): the config.
        split (str): 'val' or 'test'.
        max_images (int, optional): only the first this many images; None: all.
    """
    loader_cfg = cfg.get(f'{split}_dataloader')
    if not loader_cfg:
        raise ValueError(f'{cfg.filename} has no {split}_dataloader: choose another --split')
    check_dataset_files(cfg, splits=(split, ))
    loader_cfg = loader_cfg.copy()
    loader_cfg.update(num_workers=0, persistent_workers=False)
    if max_images is not None:
        loader_cfg.dataset = dict(loader_cfg.dataset, indices=max_images)
    return Runner.build_dataloader(loader_cfg)


def measure(model: torch.nn.Module, loader, bar) -> dict:
    """κ of every matrix of QUANTITIES (``kappas``: {'<quantity>/<stage or layer>': float64 array}) over the
    loader's images run through ``model.test_step``, and the number of padded images measured with their padding
    (``padded_images``: their preprocessor records no valid region).

    Args:
        model (nn.Module): a detector in eval mode, with a ``backbone`` and a ``data_preprocessor``.
        loader (DataLoader): the images.
        bar (tqdm): advanced by one per image.
    """
    probe = KappaProbe(model.backbone, max_matrices=EVERY_MATRIX, max_attention_tokens=EVERY_MATRIX)
    records_valid_region = isinstance(model.data_preprocessor, ValidRegionDetDataPreprocessor)
    padded = 0
    probe.active = True
    try:
        with torch.no_grad():
            for batch in loader:
                for sample in model.test_step(batch):
                    shape, batch_shape = sample.metainfo.get('img_shape'), sample.metainfo.get('batch_input_shape')
                    padded += bool(not records_valid_region and shape and batch_shape
                                   and tuple(shape[:2]) != tuple(batch_shape))
                    bar.update(1)
    finally:
        probe.active = False
        probe.remove()
    kappas = {}
    for key, chunks in probe.records.values.items():
        family, quantity, where = key.split('/')
        if family == 'kappa' and quantity in QUANTITIES:
            kappas[f'{quantity}/{where}'] = torch.cat(chunks).numpy()
    return dict(kappas=kappas, padded_images=padded)


def ordered_keys(keys) -> List[str]:
    """``keys`` ('<quantity>/<where>') in the order of QUANTITIES, then of their stage or layer."""
    return sorted(keys, key=lambda key: (list(QUANTITIES).index(key.split('/')[0]), key.split('/')[1]))


def measure_cell(cell: dict, split: str, max_images: Optional[int]) -> dict:
    """The cell's result: what it is, the images measured and :func:`summarise` of every quantity.

    Args:
        cell (dict): :func:`read_cell`'s.
        split (str): the dataloader whose images are measured, 'val' or 'test'.
        max_images (int, optional): only its first this many images; None: all.
    """
    model = load_model(cell['cfg'], cell['checkpoint'])
    loader = build_loader(cell['cfg'], split, max_images)
    with tqdm(total=len(loader.dataset), desc=cell['name'], unit='img') as bar:
        measured = measure(model, loader, bar)
    if measured['padded_images']:
        print(f'warning: {cell["name"]}: {measured["padded_images"]} padded images measured with their padding '
              "(the config's data preprocessor records no valid region; ValidRegionDetDataPreprocessor does)",
              file=sys.stderr)
    result = {key: cell[key] for key in ('name', 'cell_dir', 'variant', 'lr', 'seed', 'commit', 'config', 'checkpoint',
                                         'checkpoint_sha256', 'checked')}
    kappas = measured['kappas']
    result.update(split=split, num_images=len(loader.dataset), padded_images=measured['padded_images'],
                  singular_kappa=SINGULAR_KAPPA,
                  quantities={key: summarise(kappas[key]) for key in ordered_keys(kappas)})
    return result


def measured_cells(out_dir: str, split: str) -> List[dict]:
    """Every cell's result in ``out_dir`` (its per-cell JSONs, this run's and earlier runs'), in name order: a study's
    checkpoints are measured as its cells finish, on whichever machine and day, and the table covers them all.
    Raises ValueError for one measured on another split.

    Args:
        out_dir (str): the folder of the per-cell JSONs.
        split (str): the split this run measured.
    """
    results = []
    for path in sorted(glob.glob(osp.join(out_dir, '*.json'))):
        if osp.basename(path) == 'singular_attention.json':
            continue
        with open(path) as f:
            result = json.load(f)
        if not isinstance(result, dict) or 'quantities' not in result:
            continue  # not a cell's result
        if result.get('split') != split:
            raise ValueError(f'{path} was measured on the {result.get("split")!r} split and this run on {split!r}: '
                             'give each split its own --out-dir')
        results.append(result)
    return results


def arms_of(results: List[dict]) -> List[dict]:
    """The cells grouped by variant and rate (a plain work dir is an arm of its own), with each arm's mean share
    per quantity over its cells and each cell's share.

    Args:
        results (list[dict]): :func:`measure_cell`'s, one per cell.
    """
    arms = {}
    for result in results:
        label = (f'{result["variant"]} ({lr_name(result["lr"])})' if result['variant'] is not None
                 else result['name'])
        arms.setdefault(label, []).append(result)
    grouped = []
    for label, cells in arms.items():
        keys = ordered_keys(set.intersection(*(set(cell['quantities']) for cell in cells)))
        shares = {}
        for key in keys:
            per_cell = {cell['name']: cell['quantities'][key]['share'] for cell in cells}
            known = [share for share in per_cell.values() if share is not None]
            shares[key] = dict(mean=sum(known) / len(known) if known else None, per_cell=per_cell)
        grouped.append(dict(arm=label, cells=[cell['name'] for cell in cells],
                            seeds=[cell['seed'] for cell in cells], shares=shares))
    return grouped


def plural(count: int, noun: str) -> str:
    return f'{count} {noun}' + ('s' if count != 1 else '')


def fmt_share(share: Optional[float]) -> str:
    return '—' if share is None else f'{100 * share:.3g} %'


def markdown(arms: List[dict], split: str) -> str:
    """The table of each arm's mean share per quantity, each cell's beside it, with its caption.

    Args:
        arms (list[dict]): :func:`arms_of`'s.
        split (str): the split measured, named in the caption.
    """
    keys = ordered_keys(set.union(*(set(arm['shares']) for arm in arms)))
    lines = ['| quantity | where | ' + ' | '.join(arm['arm'] for arm in arms) + ' |',
             '|---|---|' + '---|' * len(arms)]
    for key in keys:
        quantity, where = key.split('/')
        cells = []
        for arm in arms:
            entry = arm['shares'].get(key)
            if entry is None:
                cells.append('—')
                continue
            seeds = ', '.join(f'{"seed " + str(seed) if seed is not None else name} {fmt_share(share)}'
                              for seed, (name, share) in zip(arm['seeds'], entry['per_cell'].items()))
            cells.append(f'{fmt_share(entry["mean"])} ({seeds})')
        lines.append(f'| {QUANTITIES[quantity]} | {where} | ' + ' | '.join(cells) + ' |')
    pairs = len(keys) * len(arms) * (len(arms) - 1) // 2
    lines += ['', f'Share of matrices with κ > 2^24 ≈ {SINGULAR_KAPPA:.3g} (numerically singular in float32: 1/u, u '
              f"float32's unit roundoff), on the {split} images of each cell's checkpoint: per arm the mean over its "
              "cells, each cell's share in brackets. Descriptive: "
              f'{plural(len(keys), "row")} × {plural(len(arms), "arm")}; read across arms the table holds '
              f'{plural(pairs, "pairwise comparison")}, '
              'none tested and none corrected for multiplicity.']
    return '\n'.join(lines)


def plot(arms: List[dict], path: str) -> None:
    """The share singular per layer, softmax matrices and attention outputs: one line per arm (its mean), its
    cells' shares as dots.

    Args:
        arms (list[dict]): :func:`arms_of`'s.
        path (str): the PNG written.
    """
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), squeeze=False, constrained_layout=True)
    for ax, quantity in zip(axes[0], ('attn_softmax', 'attn_out')):
        for index, arm in enumerate(arms):
            keys = [key for key in arm['shares'] if key.startswith(quantity + '/')]
            layers = [int(key.split('/')[1][len('layer'):]) for key in keys]
            colour = f'C{index % 10}'
            ax.plot(layers, [100 * (arm['shares'][key]['mean'] or 0) for key in keys], marker='o', color=colour,
                    label=arm['arm'])
            for key, layer in zip(keys, layers):
                shares = [100 * s for s in arm['shares'][key]['per_cell'].values() if s is not None]
                ax.scatter([layer] * len(shares), shares, s=10, alpha=0.4, color=colour)
        ax.set_xticks(sorted({int(key.split('/')[1][len('layer'):]) for arm in arms for key in arm['shares']
                              if key.startswith(quantity + '/')}))
        ax.set_xlabel('layer')
        ax.set_ylabel('share with κ > 2^24 (%)')
        ax.set_title(QUANTITIES[quantity], fontsize=9)
        ax.set_ylim(-3, 103)
    axes[0][0].legend(fontsize=7)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description='How many attention windows per layer are numerically singular '
                                     "(κ > 2**24) in float32, in each cell's checkpoint")
    parser.add_argument('cell_dirs', nargs='+', metavar='CELL_DIR', help="training runs' work dirs (suite cells)")
    parser.add_argument('--out-dir', required=True, help='where the JSON, .md and .png go')
    parser.add_argument('--split', default='val', choices=('val', 'test'),
                        help="the config's dataloader whose images are measured (default: val)")
    parser.add_argument('--max-images', type=int, help='measure only the first N images (default: all)')
    parser.add_argument('--checkpoint', metavar='FILE',
                        help="the checkpoint's file name in each work dir (default: the config's final one)")
    args = parser.parse_args(argv)
    if args.max_images is not None and args.max_images < 1:
        parser.error(f'--max-images {args.max_images}: give at least 1')
    try:
        cells = [read_cell(cell_dir, args.checkpoint) for cell_dir in args.cell_dirs]
        names = [cell['name'] for cell in cells]
        if len(set(names)) != len(names):
            raise ValueError(f'two work dirs have one name ({", ".join(names)}): give each cell once')
        results = [measure_cell(cell, args.split, args.max_images) for cell in cells]
    except (ValueError, DatasetNotFoundError, UnsafeCheckpointError, UnreadableCheckpointError) as error:
        sys.exit(f'error: {error}')
    os.makedirs(args.out_dir, exist_ok=True)
    for result in results:
        with open(osp.join(args.out_dir, f'{result["name"]}.json'), 'w') as f:
            json.dump(result, f, indent=1, allow_nan=False)
    try:
        results = measured_cells(args.out_dir, args.split)
    except ValueError as error:
        sys.exit(f'error: {error}')
    arms = arms_of(results)
    text = markdown(arms, args.split)
    print(text)
    with open(osp.join(args.out_dir, 'singular_attention.md'), 'w') as f:
        f.write(text + '\n')
    with open(osp.join(args.out_dir, 'singular_attention.json'), 'w') as f:
        json.dump(dict(singular_kappa=SINGULAR_KAPPA, split=args.split, machine=describe_machine(), arms=arms,
                       cells=results), f, indent=1, allow_nan=False)
    plot(arms, osp.join(args.out_dir, 'singular_attention.png'))
    print(f'wrote {", ".join(name + ".json" for name in names)}, singular_attention.md, .json and .png in '
          f'{args.out_dir}')


if __name__ == '__main__':
    main()
