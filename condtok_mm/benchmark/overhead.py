"""Cost of the conditioning: training-step and inference time and peak memory, baseline vs conditioned twin.

    python tools/benchmark/overhead.py [--models swin-t vitdet-b] [--methods spectral graying] [--batch 1]
                                       [--repeats 3] [--device cpu|cuda] [--out-dir work_dirs/benchmark/overhead]

For each model, the baseline config and its conditioned twin are built in one process with the same
random weights (pretrained init_cfg dropped: nothing is downloaded) and the config's own optimizer wrapper,
and fed the same synthetic batch (mmdet's ``demo_mm_inputs``: boxes and masks, COCO's 80 classes):

- swin-t:   configs/swin/mask-rcnn_swin-t-p4-w7{,-condtok}_fpn_1x_coco.py at 800x1333 (padded to 800x1344);
- vitdet-b: configs/vitdet/mask-rcnn_vit-b-vitdet{,-condtok}_simple-fpn_lsj-100e_coco.py at 1024x1024.

A training step is mmengine's ``model.train_step`` (data preprocessing, forward, backward, optimizer step);
inference is ``model.test_step``. After a warm-up, baseline and conditioned steps alternate (ABBA order, so
drift hits both alike) for --repeats rounds; the tables give medians and their ratio. On a GPU the steps
are timed with CUDA events and peak memory is ``torch.cuda.max_memory_allocated``; on a CPU, wall clock
and the peak resident set size of a fresh process per variant (forked from a server holding only the
imports) that builds the model and runs one training step and one inference (the RSS includes the process's
libraries and weights, the same for both).

It also times the conditioner alone on the token matrices it receives in that step (with the padding-aware
valid region the config's ValidRegionDetDataPreprocessor records: at 800x1333 each image's 200 x 334 valid
tokens of the 200 x 336 padded grid), side by side with its floor, the two float64 products it cannot avoid
on those valid tokens (the d x d Gram matrix and X times a d x d matrix), and with a plain
``torch.linalg.svd`` implementation of the same correction (C = s_1/(t-1) U V^T in the tokens' dtype; for
the configs' mode='sigma_max', scope='image' conditioners), and checks kappa(X + C) <= target_kappa on the
valid tokens. For each of the three it counts, in one more call (:mod:`.op_counts`), the launches
per batch (on a GPU the CUDA kernels that ran, on a CPU the aten ops dispatched), the host syncs per batch (on
a GPU the blocking CUDA calls, on a CPU the ops that would make a GPU wait for a value: ``.item()``,
``nonzero``, boolean-mask indexing, linalg ops that check their error codes on the host) and the float64
FLOPs per image (a consumer GPU runs float64 at 1/32-1/64 of its float32 rate), and it gives the
conditioner's time as a share of the baseline's training step and inference.

With ``--methods spectral graying`` the comparison methods are measured side by side, as more
variants of the same interleaved rounds (same weights, same batch): spectral conditioning of attention
(``-spectral`` configs, W_Q, W_K, W_V + lambda I in the forward) and Token Graying (``-graying`` configs, the
conditioner in mode 'graying', whose conditioner is also timed alone).

Goals: step-time overhead <= 1 % for Swin-T, <= 2 % for ViTDet-B; <= 1 % extra peak memory; the
conditioner within 1.5x its float64 floor.
Prints the tables, writes overhead.json, overhead.png and overhead.md (the tables in markdown) to --out-dir,
and says what machine it ran on.
"""
import argparse
import json
import logging
import multiprocessing
import os
import os.path as osp
import resource
import statistics
import sys

import torch
from mmengine.config import Config
from mmengine.logging import MMLogger
from mmengine.optim import build_optim_wrapper
from mmengine.registry import init_default_scope
from tqdm import tqdm

import condtok_mm  # noqa: F401
from condtok_mm.conditioning import condition_number
from condtok_mm.models.token_conditioner import TokenConditioner
from condtok_mm.registry import MODELS
from condtok_mm.utils import describe_machine, fall_back_from_amp_on_cpu, machine_summary, timed
from condtok_mm.utils.package_files import package_file

from .op_counts import count_ops
from .overhead_report import markdown, plot, print_tables

MODEL_PAIRS = {
    'swin-t': dict(
        baseline='configs/swin/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py',
        conditioned='configs/swin/mask-rcnn_swin-t-p4-w7-condtok_fpn_1x_coco.py',
        spectral='configs/swin/mask-rcnn_swin-t-p4-w7-spectral_fpn_1x_coco.py',
        graying='configs/swin/mask-rcnn_swin-t-p4-w7-graying_fpn_1x_coco.py',
        size=(800, 1333), step_goal=1.0),
    'vitdet-b': dict(
        baseline='configs/vitdet/mask-rcnn_vit-b-vitdet_simple-fpn_lsj-100e_coco.py',
        conditioned='configs/vitdet/mask-rcnn_vit-b-vitdet-condtok_simple-fpn_lsj-100e_coco.py',
        spectral='configs/vitdet/mask-rcnn_vit-b-vitdet-spectral_simple-fpn_lsj-100e_coco.py',
        graying='configs/vitdet/mask-rcnn_vit-b-vitdet-graying_simple-fpn_lsj-100e_coco.py',
        size=(1024, 1024), step_goal=2.0),
}
# What the launches and syncs columns count on each device (:mod:`.op_counts`).
COUNT_KINDS = dict(cpu=dict(launches='aten ops dispatched (TorchDispatchMode)',
                            syncs='host reads: ops that make a GPU wait for a value (TorchDispatchMode)'),
                   cuda=dict(launches='CUDA kernels run (torch.profiler)',
                             syncs='blocking CUDA runtime/driver calls (torch.profiler)'))
VARIANTS = ('baseline', 'conditioned')
# The comparison methods that --methods adds beside the conditioned twin; each a config of every pair.
METHODS = ('spectral', 'graying')
OBJECTS_PER_IMAGE = 8


def parse_args():
    parser = argparse.ArgumentParser(description='Time and memory of baseline vs conditioned detectors')
    parser.add_argument('--models', nargs='+', default=list(MODEL_PAIRS), choices=list(MODEL_PAIRS),
                        help='which model pairs to measure')
    parser.add_argument('--methods', nargs='*', default=[], choices=METHODS,
                        help='comparison methods measured beside the conditioned twin (default: none)')
    parser.add_argument('--size', type=int, nargs=2, metavar=('H', 'W'),
                        help='image size for every model (default: 800x1333 Swin-T, 1024x1024 ViTDet-B)')
    parser.add_argument('--batch', type=int, default=1, help='images per step')
    parser.add_argument('--repeats', type=int, default=3, help='timed rounds (each: both variants)')
    parser.add_argument('--conditioner-repeats', type=int, default=5, help='timed calls of the conditioner')
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu',
                        choices=['cpu', 'cuda'])
    parser.add_argument('--skip-memory', action='store_true', help='do not measure peak memory')
    parser.add_argument('--out-dir', default='work_dirs/benchmark/overhead', help='where to write results')
    args = parser.parse_args()
    if args.batch < 1 or args.repeats < 1 or args.conditioner_repeats < 1:
        parser.error('--batch, --repeats and --conditioner-repeats must be positive')
    if args.device == 'cuda' and not torch.cuda.is_available():
        parser.error('--device cuda: no CUDA device is available here; use --device cpu')
    return args


def build(config, device):
    """The detector of ``config`` with random weights and the config's optimizer wrapper."""
    # the optimizer constructor logs one INFO line per parameter group; keep the tables readable
    MMLogger.get_current_instance().setLevel(logging.WARNING)
    cfg = Config.fromfile(package_file(config))
    init_default_scope(cfg.get('default_scope', 'mmdet'))
    cfg.model.backbone.pop('init_cfg', None)  # random weights: nothing is downloaded
    if device == 'cpu':
        fall_back_from_amp_on_cpu(cfg)
    model = MODELS.build(cfg.model).to(device)
    model.train()
    return model, build_optim_wrapper(model, cfg.optim_wrapper)


def synthetic_batch(size, batch, device):
    from mmdet.testing import demo_mm_inputs
    torch.manual_seed(0)
    data = demo_mm_inputs(batch, [(3, *size)] * batch, num_items=[OBJECTS_PER_IMAGE] * batch,
                          num_classes=80, with_mask=True, device=device)
    for sample in data['data_samples']:
        sample.set_metainfo(dict(scale_factor=(1.0, 1.0)))  # the images are at the size the model sees
    return data


def train_step(model, optim_wrapper, data):
    model.train()
    model.train_step(data, optim_wrapper)


def inference(model, data):
    model.eval()
    with torch.no_grad():
        model.test_step(data)


def capture_conditioner_input(model, run):
    """The first TokenConditioner of ``model`` and the arguments (tokens, hw_shape, valid_shapes) it receives
    while ``run()`` executes; (None, None) for a model without one (after running)."""
    conditioner = next((m for m in model.modules() if isinstance(m, TokenConditioner)), None)
    if conditioner is None:
        run()
        return None, None
    captured = []
    handle = conditioner.register_forward_hook(
        lambda module, args, kwargs, output: captured.append((args, kwargs)), with_kwargs=True)
    run()
    handle.remove()
    args, kwargs = captured[0]
    call = dict(zip(('tokens', 'hw_shape', 'valid_shapes'), args), **kwargs)
    call['tokens'] = call['tokens'].detach()
    return conditioner, call


def valid_token_matrices(tokens, hw_shape, valid_shapes):
    """Each image's (h*w, d) matrix of valid tokens, as one list."""
    if valid_shapes is None:
        return list(tokens)
    grid = tokens.reshape(tokens.shape[0], *hw_shape, tokens.shape[-1])
    return [grid[image, :h, :w].reshape(h * w, -1) for image, (h, w) in enumerate(valid_shapes)]


def svd_correction(tokens, target_kappa):
    """The plain implementation: X + s_1/(t-1) U V^T from a thin SVD in the tokens' dtype (float32 for float16
    and bfloat16 tokens, e.g. ViTDet's under AMP: torch has no half-precision SVD)."""
    work = tokens if tokens.dtype in (torch.float32, torch.float64) else tokens.float()
    u, s, vh = torch.linalg.svd(work, full_matrices=False)
    return (work + (s[..., :1, None] / (target_kappa - 1)) * (u @ vh)).to(tokens.dtype)


def float64_products(matrices):
    """The conditioner's floor: the d x d Gram matrix and X times a d x d matrix, in float64, per image."""
    for x in matrices:
        x.transpose(-1, -2) @ x, x @ x[:x.shape[-1]]


def time_conditioner(conditioner, call, device, repeats):
    """Median seconds of the conditioner, its float64 floor and the plain SVD implementation, timed in
    turns; max kappa before and after on each image's valid tokens; each one's launches and syncs per batch
    and float64 FLOPs per image."""
    tokens, hw_shape, valid_shapes = call['tokens'], call.get('hw_shape'), call.get('valid_shapes')
    before = valid_token_matrices(tokens, hw_shape, valid_shapes)
    valid64 = [x.double() for x in before]
    implementations = {'conditioner': lambda: conditioner(**call),
                       'floor (two float64 products)': lambda: float64_products(valid64)}
    if conditioner.mode == 'sigma_max' and conditioner.scope == 'image':  # what svd_correction computes
        implementations['torch.linalg.svd'] = lambda: [svd_correction(x, conditioner.target_kappa) for x in before]
    seconds = {name: [] for name in implementations}
    with torch.no_grad():
        for fn in implementations.values():
            fn()  # warm-up
        for _ in range(repeats):
            for name, fn in implementations.items():
                seconds[name].append(timed(fn, device)[0])
        kappa_before = max(float(condition_number(x)) for x in before)
        after = {'conditioner': valid_token_matrices(conditioner(**call), hw_shape, valid_shapes)}
        if 'torch.linalg.svd' in implementations:
            after['torch.linalg.svd'] = implementations['torch.linalg.svd']()
    results = {}
    for name, fn in implementations.items():
        counts = count_ops(fn, device)
        results[name] = dict(seconds=statistics.median(seconds[name]), counts=counts,
                             launches_per_batch=counts['cuda_kernels' if device == 'cuda' else 'aten_ops'],
                             syncs_per_batch=counts['cuda_syncs' if device == 'cuda' else 'host_reads'],
                             float64_flops_per_image=counts['float64_flops'] // len(before))
        if name in after:
            results[name].update(kappa_before_max=kappa_before,
                                 kappa_after_max=max(float(condition_number(x)) for x in after[name]))
    results['conditioner']['times_floor'] = (results['conditioner']['seconds']
                                             / results['floor (two float64 products)']['seconds'])
    return results


def peak_memory_child(config, size, batch, device, queue):
    """Runs in a fresh process: peak memory of one training step and one inference."""
    torch.manual_seed(0)  # the same weights for both variants, as in the timed process
    model, optim_wrapper = build(config, device)
    data = synthetic_batch(size, batch, device)
    if device == 'cuda':
        peaks = {}
        for name, fn in (('train', lambda: train_step(model, optim_wrapper, data)),
                         ('inference', lambda: inference(model, data))):
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            fn()
            torch.cuda.synchronize()
            peaks[name] = torch.cuda.max_memory_allocated()
        queue.put(dict(kind='torch.cuda.max_memory_allocated', peaks=peaks))
        return
    train_step(model, optim_wrapper, data)
    inference(model, data)
    # ru_maxrss is in KiB on Linux; it covers the whole process (build, step, inference)
    queue.put(dict(kind='peak RSS of the process',
                   peaks=dict(process=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)))


# Each peak is measured in a process of its own, forked from a server that has imported the stack once (a spawned
# process would import it again each time, seconds of CPU): the server holds nothing but those imports, which a
# spawned process makes too, so the peak is the same.
FORKSERVER_PRELOAD = ['torch', 'mmdet.models', 'condtok_mm']


def peak_memory(config, size, batch, device):
    context = multiprocessing.get_context('forkserver')
    context.set_forkserver_preload(FORKSERVER_PRELOAD)
    queue = context.Queue()
    process = context.Process(target=peak_memory_child, args=(config, size, batch, device, queue))
    process.start()
    result = queue.get()
    process.join()
    if process.exitcode != 0:
        raise RuntimeError(f'the memory measurement of {config} failed (exit code {process.exitcode})')
    return result


def measure_pair(name, pair, args):
    size = tuple(args.size or pair['size'])
    variants = VARIANTS + tuple(args.methods)
    torch.manual_seed(0)
    models = {}
    for variant in variants:
        models[variant] = build(pair[variant], args.device)
    # Same weights for all; no method adds parameters or state-dict keys, so the keys match.
    for variant in variants[1:]:
        models[variant][0].load_state_dict(models['baseline'][0].state_dict())
    data = synthetic_batch(size, args.batch, args.device)

    conditioners = {}  # the conditioner of each variant that has one, with the call it received
    for variant in variants:  # the first training step of each doubles as its warm-up
        conditioners[variant] = capture_conditioner_input(models[variant][0],
                                                          lambda: train_step(*models[variant], data))
    conditioner, conditioner_call = conditioners['conditioned']
    for variant in variants:
        inference(models[variant][0], data)

    times = {phase: {variant: [] for variant in variants} for phase in ('train', 'inference')}
    for round_index in tqdm(range(args.repeats), desc=f'{name}: timing steps'):
        order = variants if round_index % 2 == 0 else variants[::-1]
        for variant in order:
            model, optim_wrapper = models[variant]
            times['train'][variant].append(timed(lambda: train_step(model, optim_wrapper, data), args.device)[0])
        for variant in order[::-1]:
            times['inference'][variant].append(timed(lambda: inference(models[variant][0], data), args.device)[0])
    result = dict(baseline_config=pair['baseline'], conditioned_config=pair['conditioned'],
                  size=list(size), batch=args.batch, step_goal_percent=pair['step_goal'], times=times)
    for phase, per_variant in times.items():
        base, cond = (statistics.median(per_variant[v]) for v in VARIANTS)
        result[phase] = dict(baseline_s=base, conditioned_s=cond, overhead_percent=100 * (cond / base - 1))
    # every method against the baseline, the conditioned twin included, for the side-by-side table
    result['methods'] = {variant: {phase: dict(config=pair[variant], seconds=statistics.median(per_variant[variant]),
                                               overhead_percent=100 * (statistics.median(per_variant[variant])
                                                                       / result[phase]['baseline_s'] - 1))
                                   for phase, per_variant in times.items()} for variant in variants[1:]}
    tokens = conditioner_call['tokens']
    result['conditioner'] = dict(tokens_shape=list(tokens.shape), dtype=str(tokens.dtype),
                                 valid_shapes=conditioner_call.get('valid_shapes'), counted=COUNT_KINDS[args.device],
                                 **time_conditioner(conditioner, conditioner_call, args.device,
                                                    args.conditioner_repeats))
    # The conditioner's own time against each phase: a low-noise estimate of the overhead.
    for phase, key in (('train', 'percent_of_baseline_train_step'), ('inference', 'percent_of_baseline_inference')):
        result['conditioner'][key] = 100 * result['conditioner']['conditioner']['seconds'] / result[phase]['baseline_s']
    if 'graying' in variants:
        graying, graying_call = conditioners['graying']
        result['methods']['graying']['conditioner'] = dict(time_conditioner(
            graying, graying_call, args.device, args.conditioner_repeats)['conditioner'])
    del models, tokens, conditioner, conditioner_call, conditioners

    if not args.skip_memory:
        memory = {v: peak_memory(pair[v], size, args.batch, args.device) for v in
                  tqdm(variants, desc=f'{name}: peak memory (one process each)')}
        base, cond = memory['baseline']['peaks'], memory['conditioned']['peaks']
        result['memory'] = dict(kind=memory['baseline']['kind'], peaks={
            phase: dict(baseline_bytes=base[phase], conditioned_bytes=cond[phase],
                        overhead_percent=100 * (cond[phase] / base[phase] - 1)) for phase in base})
        for variant in variants[1:]:
            peaks = memory[variant]['peaks']
            result['methods'][variant]['memory'] = {
                phase: dict(bytes=peaks[phase], overhead_percent=100 * (peaks[phase] / base[phase] - 1))
                for phase in base}
    return result


def main():
    args = parse_args()
    results = {name: measure_pair(name, MODEL_PAIRS[name], args) for name in args.models}
    machine = describe_machine(args.device)
    command = ' '.join(['python', osp.relpath(sys.argv[0])] + sys.argv[1:])
    print_tables(results, machine_summary(machine))
    os.makedirs(args.out_dir, exist_ok=True)
    with open(osp.join(args.out_dir, 'overhead.json'), 'w') as f:
        json.dump(dict(machine=machine, device=args.device, repeats=args.repeats,
                       command=' '.join(sys.argv), results=results), f, indent=2)
    with open(osp.join(args.out_dir, 'overhead.md'), 'w') as f:
        f.write(markdown(results, machine_summary(machine), command))
    plot(results, osp.join(args.out_dir, 'overhead.png'))
    print(f'wrote {osp.join(args.out_dir, "overhead.json")}, overhead.md and overhead.png')


if __name__ == '__main__':
    main()
