"""How far two runs of the same cell (one config, seed and rate) differ: their final weights bit for bit, their test
metrics, and their loss, κ and validation curves iteration by iteration, from the two work dirs (a suite cell's, or
tools/train.py's followed by tools/test.py --work-dir WORK_DIR/test).

    python tools/analysis/repeatability.py WORK_DIR_A WORK_DIR_B [--checkpoint epoch_12.pth] [--out-dir DIR]

A work dir without the checkpoint (saved suite records keep none) is compared on its metrics and curves only.
Prints a table; writes repeatability.json and repeatability.png (the two loss curves and their difference).
"""
import argparse
import json
import math
import os
import os.path as osp

import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from condtok_mm.suites.results import joined_records, newest, read_json, record_stream, training_runs
from condtok_mm.compat.checkpoint_loading import load_from_local


def weights(path):
    """The state dict of a checkpoint, read weights-only."""
    checkpoint = load_from_local(path, map_location='cpu')
    return checkpoint.get('state_dict', checkpoint)


def same_bits(x, y):
    """Bit-identical tensors, NaN included (torch.equal calls two NaN unequal)."""
    if x.is_floating_point():
        x, y = x.contiguous().view(torch.uint8), y.contiguous().view(torch.uint8)
    return torch.equal(x, y)


def same_value(x, y):
    return x == y or (isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y))


def compare_weights(a, b):
    """How many tensors are bit-identical, and the largest absolute and relative difference of the others."""
    if a.keys() != b.keys():
        raise ValueError(f'the checkpoints hold other keys: {sorted(set(a) ^ set(b))[:5]}')
    identical, max_abs, max_rel, differing = 0, 0.0, 0.0, []
    for key in a:
        x, y = a[key], b[key]
        if x.shape == y.shape and x.dtype == y.dtype and same_bits(x, y):
            identical += 1
            continue
        differing.append(key)
        diff = (x.double() - y.double()).abs().nan_to_num(nan=math.inf)  # NaN in one run only: infinitely apart
        max_abs = max(max_abs, float(diff.max()))
        max_rel = max(max_rel, float((diff / x.double().abs().clamp_min(1e-12)).max()))
    return dict(tensors=len(a), identical=identical, differing=differing[:10], max_abs=max_abs, max_rel=max_rel)


def curves(work_dir):
    """{'loss': {iter: value}, kappa key: {iter: value}, validation key: {epoch: value}} of a work dir's runs."""
    found = {}
    for record in joined_records(training_runs(work_dir)):
        stream, step = record_stream(record)
        if stream == 'train' and 'loss' in record:
            found.setdefault('loss', {})[step] = record['loss']
        for key, value in record.items():
            if stream == 'val' and key.startswith('coco/') and isinstance(value, (int, float)):
                found.setdefault(f'validation {key}', {})[step] = 100 * value
            elif stream == 'hook' and key.startswith('kappa/') and isinstance(value, (int, float)):
                found.setdefault(key, {})[step] = value
    return found


def compare_curve(a, b):
    """Where two curves first differ (the common steps in order), how many steps differ, the largest difference."""
    steps = sorted(set(a) & set(b))
    differing = [step for step in steps if not same_value(a[step], b[step])]
    gaps = [abs(a[step] - b[step]) for step in differing]
    largest = max((math.inf if math.isnan(gap) else gap for gap in gaps), default=0.0)  # NaN in one run only
    return dict(steps=len(steps), differing=len(differing), first_differing=differing[0] if differing else None,
                max_abs=largest)


def test_metrics(work_dir):
    path = newest(osp.join(work_dir, 'test', '*', '*.json'))
    if path is None:
        return None
    return {key: 100 * value for key, value in read_json(path).items()
            if key.startswith('coco/') and isinstance(value, (int, float))}


def compare(dir_a, dir_b, checkpoint):
    result = dict(runs=[dir_a, dir_b], checkpoint=checkpoint)
    paths = [osp.join(d, checkpoint) for d in (dir_a, dir_b)] if checkpoint else []
    result['weights'] = compare_weights(weights(paths[0]), weights(paths[1])) if paths and all(
        osp.isfile(p) for p in paths) else None
    metrics = [test_metrics(d) for d in (dir_a, dir_b)]
    result['metrics'] = None if None in metrics else {
        key: dict(a=metrics[0][key], b=metrics[1][key], difference=metrics[1][key] - metrics[0][key])
        for key in sorted(set(metrics[0]) & set(metrics[1]))}
    curves_a, curves_b = curves(dir_a), curves(dir_b)
    result['curves'] = {key: compare_curve(curves_a[key], curves_b[key]) for key in sorted(set(curves_a) & set(curves_b))}
    return result, curves_a, curves_b


def finite(value):
    """``value`` with every non-finite float as None, so that the JSON is valid."""
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(item) for item in value]
    return None if isinstance(value, float) and not math.isfinite(value) else value


def table(result):
    lines = [f'{result["runs"][0]}  vs  {result["runs"][1]}']
    w = result['weights']
    if w is None:
        lines.append('weights: not compared (no checkpoint in both work dirs)')
    else:
        lines.append(f'weights ({result["checkpoint"]}): {w["identical"]} of {w["tensors"]} tensors bit-identical'
                     + ('' if w['identical'] == w['tensors'] else
                        f'; largest difference {w["max_abs"]:.3g} (relative {w["max_rel"]:.3g})'))
    for key, value in (result['metrics'] or {}).items():
        if key in ('coco/bbox_mAP', 'coco/segm_mAP'):
            lines.append(f'{key}: {value["a"]:.1f} vs {value["b"]:.1f} (difference {value["difference"]:+.1f})')
    for key, value in result['curves'].items():
        if key == 'loss' or key.startswith('validation coco/bbox_mAP') or key == 'kappa/attn_softmax_mean/layer00':
            where = 'identical' if value['differing'] == 0 else (
                f'{value["differing"]} of {value["steps"]} steps differ, the first at {value["first_differing"]}, '
                f'by up to {value["max_abs"]:.3g}')
            lines.append(f'{key}: {where}')
    return '\n'.join(lines)


def plot(curves_a, curves_b, path):
    a, b = curves_a.get('loss', {}), curves_b.get('loss', {})
    steps = sorted(set(a) & set(b))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True, constrained_layout=True)
    top.plot(steps, [a[s] for s in steps], label='run A')
    top.plot(steps, [b[s] for s in steps], '--', label='run B')
    top.set_ylabel('training loss')
    top.legend()
    bottom.plot(steps, [b[s] - a[s] for s in steps])
    bottom.set_ylabel('B - A')
    bottom.set_xlabel('iteration')
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description='How far two runs of the same cell differ')
    parser.add_argument('work_dirs', nargs=2, help='the two runs\' work dirs')
    parser.add_argument('--checkpoint', default='epoch_12.pth', help='the final checkpoint\'s name in both '
                        '(default: epoch_12.pth; "" compares no weights)')
    parser.add_argument('--out-dir', help='where repeatability.json and .png go (default: the first work dir)')
    args = parser.parse_args(argv)
    for work_dir in args.work_dirs:
        if not training_runs(work_dir):
            parser.error(f'{work_dir} holds no training run (no <timestamp>/vis_data/scalars.json)')
    result, curves_a, curves_b = compare(*args.work_dirs, args.checkpoint)
    print(table(result))
    out_dir = args.out_dir or args.work_dirs[0]
    os.makedirs(out_dir, exist_ok=True)
    with open(osp.join(out_dir, 'repeatability.json'), 'w') as f:
        json.dump(finite(result), f, indent=1)
    plot(curves_a, curves_b, osp.join(out_dir, 'repeatability.png'))
    print(f'wrote repeatability.json and repeatability.png in {out_dir}')


if __name__ == '__main__':
    main()
