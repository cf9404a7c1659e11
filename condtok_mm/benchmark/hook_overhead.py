"""Cost of AttentionKappaHook: one recording against a training step, and the overhead per interval.

    python tools/benchmark/hook_overhead.py [--config CONFIG] [--size H W] [--batch 2] [--repeats 3]

For a config's backbone at an input size, it times (interleaved, medians) a training step of the backbone
alone (forward + backward) with and without the probe recording, and reports the recording cost as a
fraction of that step at several intervals. The backbone step is a lower bound of the detector's training
step, so the overhead it reports is an upper bound. Prints a table, writes hook_overhead.json and
hook_overhead.png to --out-dir, and says what machine it ran on.
"""
import argparse
import json
import os
import os.path as osp
import statistics

import matplotlib
import torch
from mmengine.config import Config
from mmengine.registry import init_default_scope
from tqdm import tqdm

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402

import condtok_mm  # noqa: F401
from condtok_mm.engine.hooks.kappa_probe import KappaProbe
from condtok_mm.registry import MODELS
from condtok_mm.utils import describe_machine, machine_summary, timed

INTERVALS = (1, 10, 50, 100)


def time_step(backbone, probe, images, record):
    """Seconds of one backbone forward + backward, recording kappa (and reducing it) when ``record``."""
    def step():
        probe.active = record
        sum(o.float().mean() for o in backbone(images)).backward()
        probe.active = False
        probe.reduce()
    return timed(step)[0]


def main():
    parser = argparse.ArgumentParser(description='Measure the cost of AttentionKappaHook')
    parser.add_argument('--config', default='configs/mask-rcnn_condtok.py')
    parser.add_argument('--size', type=int, nargs=2, default=(800, 1344), metavar=('H', 'W'))
    parser.add_argument('--batch', type=int, default=2)
    parser.add_argument('--repeats', type=int, default=3)
    parser.add_argument('--out-dir', default='work_dirs/benchmark')
    args = parser.parse_args()

    cfg = Config.fromfile(args.config)
    init_default_scope(cfg.get('default_scope', 'mmdet'))
    backbone_cfg = cfg.model.backbone.copy()
    backbone_cfg.pop('init_cfg', None)  # random weights: nothing is downloaded
    backbone = MODELS.build(backbone_cfg)
    backbone.train()  # SwinTransformer.train() returns None: no chaining
    probe = KappaProbe(backbone)
    images = torch.randn(args.batch, 3, *args.size)
    time_step(backbone, probe, images, record=True)  # warm-up
    plain, recording = [], []
    for _ in tqdm(range(args.repeats), desc='timing steps (plain, recording)'):
        plain.append(time_step(backbone, probe, images, record=False))
        recording.append(time_step(backbone, probe, images, record=True))
    step, record_step = statistics.median(plain), statistics.median(recording)
    cost = max(record_step - step, 0.0)
    overhead = {k: 100 * cost / (k * step) for k in INTERVALS}

    machine = describe_machine()
    print(f'machine: {machine_summary(machine)}')
    print(f'{args.config} backbone, batch {args.batch} at {args.size[0]}x{args.size[1]}, '
          f'{len(probe.attention_layers)} attention layers')
    print(f'backbone training step: {step:.3f} s   with recording: {record_step:.3f} s   '
          f'one recording: {cost:.3f} s')
    print(f'{"interval":>8} {"overhead (% of backbone step, upper bound)":>44}')
    for k, value in overhead.items():
        print(f'{k:>8} {value:>44.3f}')
    os.makedirs(args.out_dir, exist_ok=True)
    result = dict(config=args.config, size=list(args.size), batch=args.batch, repeats=args.repeats,
                  machine=machine, backbone_step_s=step, recording_step_s=record_step,
                  recording_cost_s=cost, overhead_percent=overhead, plain_s=plain, recording_s=recording)
    with open(osp.join(args.out_dir, 'hook_overhead.json'), 'w') as f:
        json.dump(result, f, indent=2)
    fig, ax = plt.subplots(figsize=(6, 4), constrained_layout=True)
    ax.bar([str(k) for k in INTERVALS], list(overhead.values()))
    ax.axhline(1.0, color='red', linestyle='--', label='1% goal')
    ax.set_xlabel('interval (iterations)')
    ax.set_ylabel('overhead, % of backbone step')
    ax.set_yscale('log')
    ax.set_title(f'AttentionKappaHook cost\n{osp.basename(args.config)} {args.size[0]}x{args.size[1]}')
    ax.legend()
    fig.savefig(osp.join(args.out_dir, 'hook_overhead.png'), dpi=110)
    print(f'wrote {osp.join(args.out_dir, "hook_overhead.json")} and hook_overhead.png')


if __name__ == '__main__':
    main()
