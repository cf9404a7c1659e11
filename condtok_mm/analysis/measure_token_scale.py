"""The token scale that each dose of the conditioning gives: r = ||X + C||_F / ||X||_F on each val image's tokens.

    python tools/analysis/measure_token_scale.py CONFIG [CHECKPOINT ...] --dose NAME KEY=VALUE [KEY=VALUE ...] ...
        [--num-images 50] [--seed 0] [--out-dir DIR] [--cfg-options ...]

mode='sigma_max' lifts every singular value of X by s_1 / (t - 1), so r grows as the target kappa t falls; Token
Graying divides by s_1, so r is far below 1. Comparing doses of X + C therefore compares token scales too; this
measures the scale each dose would give, on the same tokens. X is what the config's first conditioner receives
(the patch embedding's output, each image's valid tokens) in the model of each CHECKPOINT, or, without one, an
initialization seeded as a training run's (mmengine's set_random_seed(--seed), then the model's init_weights; the
same distribution as a cell's initial weights, not necessarily the same numbers). Each dose is the config's ``conditioning`` with the
KEY=VALUE overrides and without a token-scale control (X + C itself, whatever the config's control).

Prints r per model and dose (mean over images, and the range) and writes token_scale.json and token_scale.png to
--out-dir (default: work_dirs/<config name>/token_scale).
"""
import argparse
import ast
import json
import os
import os.path as osp
import sys
from typing import Dict, List, Optional, Sequence, Tuple

import matplotlib
import torch
from mmengine.config import Config, DictAction
from mmengine.registry import init_default_scope
from mmengine.runner import Runner, load_checkpoint
from mmengine.runner.utils import set_random_seed
from tqdm import tqdm

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402

import condtok_mm  # noqa: F401  (registration)
from condtok_mm import compat
from condtok_mm.engine.hooks.kappa_probe.valid_tokens import image_token_matrices
from condtok_mm.models.layout import conditioner_stage
from condtok_mm.models.token_conditioner import TokenConditioner
from condtok_mm.models.valid_region import record_valid_region
from condtok_mm.registry import MODELS
from condtok_mm.utils import DatasetNotFoundError, check_dataset_files, describe_machine


def parse_dose(words: Sequence[str]) -> Tuple[str, dict]:
    """``NAME KEY=VALUE ...`` -> (NAME, {KEY: VALUE}); values as Python literals where they parse, else strings."""
    name, *pairs = words
    overrides = {}
    for pair in pairs:
        key, sep, value = pair.partition('=')
        if not sep or not key:
            raise ValueError(f'--dose {name}: {pair!r} is not KEY=VALUE (e.g. target_kappa=1.25 or mode=graying)')
        try:
            overrides[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            overrides[key] = value
    return name, overrides


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description="Token scale ||X + C|| / ||X|| of each dose on a model's val tokens")
    parser.add_argument('config', help='a conditioned config file')
    parser.add_argument('checkpoints', nargs='*', help='checkpoints (none: an initialization, seeded by --seed)')
    parser.add_argument('--dose', nargs='+', action='append', required=True, metavar='NAME [KEY=VALUE]',
                        help="a dose: its name and the overrides of the config's conditioning, e.g. "
                        '--dose kappa_1.25 target_kappa=1.25 (repeat for each dose)')
    parser.add_argument('--num-images', type=int, default=50, help='val images per model')
    parser.add_argument('--seed', type=int, default=0, help='seed of the initialization without checkpoints')
    parser.add_argument('--out-dir', help='where the JSON and PNG go')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction, help='override config settings')
    args = parser.parse_args(argv)
    try:
        args.dose = [parse_dose(words) for words in args.dose]
    except ValueError as error:
        parser.error(str(error))
    if len({name for name, _ in args.dose}) != len(args.dose):
        parser.error('--dose: every dose needs its own name')
    return args


def dose_conditioners(conditioning: dict, doses: Sequence[Tuple[str, dict]]) -> Dict[str, TokenConditioner]:
    """Each dose's TokenConditioner: ``conditioning`` with the dose's overrides and no token-scale control."""
    return {name: MODELS.build({**conditioning, **overrides, 'control': None}) for name, overrides in doses}


def token_scales(tokens: torch.Tensor, hw_shape: Optional[Tuple[int, int]], valid_shapes,
                 conditioners: Dict[str, TokenConditioner]) -> Dict[str, List[float]]:
    """Per dose, r = ||X + C||_F / ||X||_F of each image's valid token matrix X (float64 norms)."""
    norms_x = [x.double().flatten(1).norm(dim=1) for _, x in image_token_matrices(tokens, hw_shape, valid_shapes)]
    if any((norm_x == 0).any() for norm_x in norms_x):
        raise ValueError('token_scale: an image has all-zero tokens, so its token scale is not defined')
    scales = {}
    for name, conditioner in conditioners.items():
        after = image_token_matrices(conditioner(tokens, hw_shape, valid_shapes), hw_shape, valid_shapes)
        scales[name] = [r for norm_x, (_, y) in zip(norms_x, after)
                        for r in (y.double().flatten(1).norm(dim=1) / norm_x).tolist()]
    return scales


def first_conditioner(backbone: torch.nn.Module, config: str) -> TokenConditioner:
    conditioners = [(conditioner_stage(name), module) for name, module in backbone.named_modules()
                    if isinstance(module, TokenConditioner)]
    if not conditioners:
        raise ValueError(f'{config} has no TokenConditioner in its backbone: the token scale of a dose is measured '
                         'on a conditioned config (e.g. configs/demo/mask-rcnn_swin-mini-condtok_fpn_12e_shapes.py)')
    return min(conditioners, key=lambda item: item[0])[1]


def measure(cfg, checkpoint, doses, num_images, seed, bar) -> Dict[str, List[float]]:
    """r per dose for each of the first ``num_images`` val images, in the model of ``checkpoint``."""
    if checkpoint is None:
        set_random_seed(seed)
    model = MODELS.build(cfg.model)
    if checkpoint:
        load_checkpoint(model, checkpoint, map_location='cpu')
    else:
        model.init_weights()  # as a training run does: e.g. a position embedding conditioned with X gets its init
    model.eval()
    conditioners = dose_conditioners(cfg.model.backbone.conditioning.to_dict(), doses)
    scales = {name: [] for name, _ in doses}

    def hook(module, args, kwargs, output):
        call = dict(zip(('tokens', 'hw_shape', 'valid_shapes'), args), **kwargs)
        for name, values in token_scales(call['tokens'], call.get('hw_shape'), call.get('valid_shapes'),
                                         conditioners).items():
            scales[name] += values

    handle = first_conditioner(model.backbone, cfg.filename).register_forward_hook(hook, with_kwargs=True)
    loader_cfg = cfg.val_dataloader.copy()
    loader_cfg.update(num_workers=0, persistent_workers=False)
    seen = 0
    with torch.no_grad():
        for batch in Runner.build_dataloader(loader_cfg):
            data = model.data_preprocessor(batch, False)
            take = min(num_images - seen, data['inputs'].shape[0])
            inputs = data['inputs'][:take]
            record_valid_region(inputs, [sample.img_shape for sample in data['data_samples'][:take]])
            model.backbone(inputs)
            seen += take
            bar.update(take)
            if seen >= num_images:
                break
    handle.remove()
    return scales


def summary(values: Sequence[float]) -> dict:
    return dict(mean=sum(values) / len(values), min=min(values), max=max(values), per_image=list(values))


def table(models: Sequence[dict], doses: Sequence[str]) -> str:
    lines = ['| model | ' + ' | '.join(f'r {name}' for name in doses) + ' |', '|---' * (len(doses) + 1) + '|']
    for model in models:
        cells = [f'{model["r"][n]["mean"]:.3g} ({model["r"][n]["min"]:.3g}–{model["r"][n]["max"]:.3g})' for n in doses]
        lines.append(f'| {model["model"]} | ' + ' | '.join(cells) + ' |')
    return '\n'.join(lines)


def plot(models: Sequence[dict], doses: Sequence[str], title: str, out: str) -> None:
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(doses) * max(1, len(models)) ** 0.5), 4.5),
                           constrained_layout=True)
    width = 0.8 / len(models)
    for index, model in enumerate(models):
        means = [model['r'][n]['mean'] for n in doses]
        low = [model['r'][n]['mean'] - model['r'][n]['min'] for n in doses]
        high = [model['r'][n]['max'] - model['r'][n]['mean'] for n in doses]
        ax.bar([i + (index - len(models) / 2 + 0.5) * width for i in range(len(doses))], means, width,
               yerr=[low, high], capsize=2, label=model['model'])
    ax.axhline(1.0, color='k', lw=0.8)
    ax.set_xticks(range(len(doses)), doses)
    ax.set_yscale('log')
    ax.set_ylabel('r = ||X + C|| / ||X|| (mean, range over images)')
    ax.set_title(title)
    if len(models) <= 12:
        ax.legend(fontsize=7)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv=None):
    args = parse_args(argv)
    compat.apply()  # loads the checkpoints with the fixed local loader
    cfg = Config.fromfile(args.config)
    if args.cfg_options:
        cfg.merge_from_dict(args.cfg_options)
    if not cfg.model.get('backbone', {}).get('conditioning'):
        sys.exit(f'error: {args.config} has no model.backbone.conditioning: the token scale of a dose is measured '
                 'on a conditioned config (e.g. configs/demo/mask-rcnn_swin-mini-condtok_fpn_12e_shapes.py)')
    try:
        check_dataset_files(cfg, splits=('val', ))
    except DatasetNotFoundError as error:
        sys.exit(f'error: {error}')
    init_default_scope(cfg.get('default_scope', 'mmdet'))
    out_dir = args.out_dir or osp.join('work_dirs', osp.splitext(osp.basename(args.config))[0], 'token_scale')
    os.makedirs(out_dir, exist_ok=True)
    checkpoints = args.checkpoints or [None]
    names = [name for name, _ in args.dose]
    models = []
    with tqdm(total=len(checkpoints) * args.num_images, desc='token scale', unit='img') as bar:
        for checkpoint in checkpoints:
            try:
                scales = measure(cfg, checkpoint, args.dose, args.num_images, args.seed, bar)
            except ValueError as error:
                sys.exit(f'error: {error}')
            models.append(dict(model=checkpoint or f'initialization (seed {args.seed})',
                               num_images=len(scales[names[0]]), r={n: summary(v) for n, v in scales.items()}))
    text = table(models, names)
    print(text)
    with open(osp.join(out_dir, 'token_scale.json'), 'w') as f:
        json.dump(dict(config=args.config, doses=dict(args.dose), machine=describe_machine(), models=models), f,
                  indent=2)
    plot(models, names, f'{osp.basename(args.config)}: token scale of each dose', osp.join(out_dir, 'token_scale.png'))
    print(f'wrote {osp.join(out_dir, "token_scale.json")} and {osp.join(out_dir, "token_scale.png")}')


if __name__ == '__main__':
    main()
