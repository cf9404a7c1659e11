"""CPU latency of an exported conditioned backbone: onnxruntime against its unconditioned twin and PyTorch eager.

    python tools/benchmark/onnx_latency.py [--models swin-t vitdet-b] [--shape H W] [--threads 2] [--repeats 5]
        [--out-dir work_dirs/benchmark/onnx_latency]

For each model the backbone of the conditioned config and of its baseline twin (same arguments but the
conditioning, random weights: nothing is downloaded) are exported with condtok_mm.deployment at one image size
(default: swin-t 800 x 1344, the padded size of an 800 x 1333 COCO image; vitdet-b 1024 x 1024) and run on one
random image by onnxruntime's CPU provider and by PyTorch eager (the conditioned backbone with the exported
solver, Newton-Schulz, and with the CPU default, eigh), ``--threads`` threads each. After one warm-up call of each,
the variants run in turns for ``--repeats`` rounds (so that drift hits them alike); the table gives each one's
median and its ratio to the onnxruntime baseline, and the largest difference of onnxruntime's conditioned features
from PyTorch's beside PyTorch's own float32 error (its float32 features against a float64 copy's), both relative
to the largest feature (condtok_mm.deployment.parity). Prints the table, writes onnx_latency.json and onnx_latency.png
to --out-dir (the .onnx files go to a temporary folder), and says what machine it ran on.
"""
import argparse
import json
import os
import os.path as osp
import statistics
import tempfile
import time

import torch
from mmengine.config import Config
from mmengine.registry import init_default_scope
from tqdm import tqdm

import condtok_mm  # noqa: F401  (registration)
from condtok_mm.deployment import export_onnx, use_exportable_solver
from condtok_mm.deployment.parity import output_parity
from condtok_mm.deployment.runtime import cpu_session
from condtok_mm.registry import MODELS
from condtok_mm.utils import describe_machine, machine_summary
from condtok_mm.utils.package_files import package_file

MODEL_PAIRS = {
    'swin-t': dict(baseline='configs/swin/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py',
                   conditioned='configs/swin/mask-rcnn_swin-t-p4-w7-condtok_fpn_1x_coco.py', shape=(800, 1344)),
    'vitdet-b': dict(baseline='configs/vitdet/mask-rcnn_vit-b-vitdet_simple-fpn_lsj-100e_coco.py',
                     conditioned='configs/vitdet/mask-rcnn_vit-b-vitdet-condtok_simple-fpn_lsj-100e_coco.py',
                     shape=(1024, 1024)),
}
VARIANTS = ('onnxruntime baseline', 'onnxruntime conditioned', 'PyTorch baseline',
            'PyTorch conditioned (Newton-Schulz)', 'PyTorch conditioned (eigh)')


def parse_args():
    parser = argparse.ArgumentParser(description='onnxruntime CPU latency of conditioned backbones')
    parser.add_argument('--models', nargs='+', default=list(MODEL_PAIRS), choices=list(MODEL_PAIRS))
    parser.add_argument('--shape', type=int, nargs=2, metavar=('H', 'W'),
                        help='image size for every model (default: 800x1344 Swin-T, 1024x1024 ViTDet-B)')
    parser.add_argument('--threads', type=int, default=2, help='intra-op threads of onnxruntime and of torch')
    parser.add_argument('--repeats', type=int, default=5, help='timed rounds (each: every variant once)')
    parser.add_argument('--out-dir', default='work_dirs/benchmark/onnx_latency', help='where to write results')
    args = parser.parse_args()
    if args.threads < 1 or args.repeats < 1:
        parser.error('--threads and --repeats must be positive')
    return args


def build_backbone(config):
    """The backbone of ``config`` in eval mode, randomly initialized (its pretrained init_cfg dropped)."""
    cfg = Config.fromfile(package_file(config))
    init_default_scope(cfg.get('default_scope', 'mmdet'))
    cfg.model.backbone.pop('init_cfg', None)
    backbone = MODELS.build(cfg.model.backbone)
    backbone.eval()  # mmdet's SwinTransformer.train() returns None: no chaining
    return backbone


def export(backbone, image, path):
    with torch.no_grad():
        outputs = backbone(image)
    count = len(outputs) if isinstance(outputs, (list, tuple)) else 1
    return export_onnx(backbone, (image, ), path, ['image'], [f'feat{i}' for i in range(count)])


def measure(name, pair, shape, threads, repeats, onnx_dir):
    """Median seconds of every variant on one image of ``shape``, and the conditioned graph's largest relative
    difference from PyTorch."""
    torch.manual_seed(0)
    baseline, conditioned = build_backbone(pair['baseline']), build_backbone(pair['conditioned'])
    conditioned.load_state_dict(baseline.state_dict())  # the same weights (the conditioners have none)
    image = torch.randn(1, 3, *shape)
    started = time.perf_counter()
    baseline_file = export(baseline, image, osp.join(onnx_dir, f'{name}_baseline.onnx'))
    use_exportable_solver(conditioned)
    conditioned_file = export(conditioned, image, osp.join(onnx_dir, f'{name}_conditioned.onnx'))
    export_seconds = time.perf_counter() - started
    sessions = {'baseline': cpu_session(baseline_file, threads), 'conditioned': cpu_session(conditioned_file, threads)}
    feed = {'image': image.numpy()}
    eigh_twin = build_backbone(pair['conditioned'])
    eigh_twin.load_state_dict(baseline.state_dict())
    for conditioner in (m for m in eigh_twin.modules() if type(m).__name__ == 'TokenConditioner'):
        conditioner.solver = 'eigh'
    runs = {'onnxruntime baseline': lambda: sessions['baseline'].run(None, feed),
            'onnxruntime conditioned': lambda: sessions['conditioned'].run(None, feed),
            'PyTorch baseline': lambda: baseline(image),
            'PyTorch conditioned (Newton-Schulz)': lambda: conditioned(image),
            'PyTorch conditioned (eigh)': lambda: eigh_twin(image)}
    times = {variant: [] for variant in VARIANTS}
    parity = output_parity(conditioned, conditioned_file, {'image': image})
    with torch.no_grad():
        for run in runs.values():  # warm-up
            run()
        for _ in tqdm(range(repeats), desc=f'{name} {shape[0]}x{shape[1]}', unit='round'):
            for variant in VARIANTS:
                started = time.perf_counter()
                runs[variant]()
                times[variant].append(time.perf_counter() - started)
    medians = {variant: statistics.median(values) for variant, values in times.items()}
    return dict(shape=list(shape), baseline_config=pair['baseline'], conditioned_config=pair['conditioned'],
                export_seconds=export_seconds, times=times, median_s=medians,
                ratio_to_onnxruntime_baseline={v: medians[v] / medians['onnxruntime baseline'] for v in VARIANTS},
                onnxruntime_vs_pytorch=max(output.onnxruntime_vs_pytorch for output in parity),
                pytorch_float32_vs_float64=max(output.float32_vs_float64 for output in parity))


def print_table(results, machine):
    print(f'\nBackbone latency, one image, CPU ({machine_summary(machine)}):')
    print(f'| model | size | {" | ".join(VARIANTS)} | conditioned: onnxruntime vs PyTorch | PyTorch float32 vs '
          'float64 |')
    print('|---|---|' + '---|' * len(VARIANTS) + '---|---|')
    for name, result in results.items():
        cells = [f'{1000 * result["median_s"][v]:.0f} ms ({result["ratio_to_onnxruntime_baseline"][v]:.2f}x)'
                 for v in VARIANTS]
        print(f'| {name} | {result["shape"][0]}x{result["shape"][1]} | {" | ".join(cells)} | '
              f'{result["onnxruntime_vs_pytorch"]:.1e} | {result["pytorch_float32_vs_float64"]:.1e} |')


def plot(results, machine, path):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4), squeeze=False)
    for axis, (name, result) in zip(axes[0], results.items()):
        axis.barh(range(len(VARIANTS)), [1000 * result['median_s'][v] for v in VARIANTS], color='tab:blue')
        axis.set_yticks(range(len(VARIANTS)), VARIANTS)
        axis.invert_yaxis()
        axis.set_xlabel('median latency (ms)')
        axis.set_title(f'{name} backbone, {result["shape"][0]}x{result["shape"][1]}')
    fig.suptitle(machine_summary(machine), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main():
    args = parse_args()
    torch.set_num_threads(args.threads)
    os.makedirs(args.out_dir, exist_ok=True)
    with tempfile.TemporaryDirectory() as onnx_dir:
        results = {name: measure(name, MODEL_PAIRS[name], tuple(args.shape or MODEL_PAIRS[name]['shape']),
                                 args.threads, args.repeats, onnx_dir) for name in args.models}
    machine = describe_machine('cpu', packages=('onnx', 'onnxscript', 'onnxruntime'))
    print_table(results, machine)
    with open(osp.join(args.out_dir, 'onnx_latency.json'), 'w') as f:
        json.dump(dict(machine=machine, threads=args.threads, repeats=args.repeats, results=results), f, indent=2)
    plot(results, machine, osp.join(args.out_dir, 'onnx_latency.png'))
    print(f'wrote onnx_latency.json and onnx_latency.png to {args.out_dir}')


if __name__ == '__main__':
    main()
