"""Cost of TokenConditioner on padded batches of patch-embedding-sized tokens, beside its float64 floor: the float64
reference (solver='reference_gram', one image at a time), the batched path (the default) with either solver, and Token Graying
in its SVD form (mode='graying') and its DCT form (mode='graying_dct') beside them; on the CPU or on a CUDA device.

    python tools/benchmark/conditioner_cost.py [--grids 200x336x96 64x64x768] [--repeats 5]
        [--profile] [--out-dir work_dirs/conditioner_cost]
    python tools/benchmark/conditioner_cost.py --device cuda [--batches 2 8] [--repeats 20] [--budget-s 300]

On the CPU. Tokens: LayerNorm'd random (B=2, H*W, d) grids, image 1 padded (its valid region 3/4 x 2/3 of the grid);
the defaults are Swin-T's (200 x 336 patches of an 800 x 1344 image, d 96) and ViTDet-B's (64 x 64, d 768). The
floor is what any float64 conditioner of this construction must do: cast X to float64, form the d x d Gram
matrix, one N x d x d product, cast back. Each row: the minimum wall time of --repeats calls taken in interleaved
turns (every method once per turn, so that load on the machine reaches them alike), its ratio to the floor, the
aten calls and host reads of one call (:mod:`.op_counts`) and its passes over the tokens
(:mod:`.byte_counts`: bytes of N x d-sized tensors read and written, in float32 passes over X) and its
peak extra memory in units of X in float32 (byte_counts.peak_extra_bytes: the storages it allocates, result included);
for Newton-Schulz, its gap to eigh: ||(X + C)_newton_schulz - (X + C)_eigh||_F / ||C_eigh||_F. --profile adds, for
each batched solver, the aten ops that took the most self time in one call (torch.profiler).

On a CUDA device (--device cuda; :mod:`condtok_mm.benchmark.conditioner_cuda` says what each row holds): each batch
size of --batches, the batched path's solvers eager, compiled and replayed from a CUDA graph, beside the float64
floor, Token Graying's SVD form and the float32 SVD form, ms per image by CUDA events (median of --repeats). It
needs only torch: where mmengine is not installed, importing condtok_mm registers nothing (condtok_mm/__init__.py).
Prints the table, writes conditioner_cost.json and conditioner_cost.png; the numbers are this machine's.
"""
import argparse
import json
import os
import os.path as osp
import platform
import subprocess
import sys
import time

import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402


METHODS = (('float64 floor', None), ('reference (gram)', dict(solver='reference_gram')),
           ('batched, eigh', dict(solver='eigh')), ('batched, newton_schulz', dict(solver='newton_schulz')),
           ('graying, SVD form', dict(mode='graying')), ('graying, DCT form', dict(mode='graying_dct')))

# The methods whose time --profile breaks down by aten op.
PROFILED = ('batched, eigh', 'batched, newton_schulz')
# The methods that compute the same X + C as the batched path with eigh, whose difference from it is reported.
SAME_MAP = ('batched, newton_schulz',)


def float64_floor(tokens: torch.Tensor) -> torch.Tensor:
    """Cast, Gram matrix, one product per image, cast back: what a float64 conditioner cannot avoid."""
    x = tokens.double()
    return (x @ (x.transpose(-1, -2) @ x)).to(tokens.dtype)


def _grid(text: str):
    height, width, channels = (int(v) for v in text.lower().split('x'))
    return height, width, channels


def profile_call(call, rows: int = 8):
    """The aten ops that take the most self CPU time in one call (torch.profiler): name, ms, calls."""
    with torch.no_grad(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
        call()
    events = sorted(profiler.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)[:rows]
    return [dict(op=e.key, ms=e.self_cpu_time_total / 1e3, calls=e.count) for e in events]


def measure(height: int, width: int, channels: int, repeats: int, methods, profile: bool = False):
    # The CPU's counters and TokenConditioner import the whole package; --device cuda needs only torch.
    from condtok_mm.models.token_conditioner import TokenConditioner
    from .byte_counts import count_bytes, padded_tokens, peak_extra_bytes
    from .op_counts import count_ops
    tokens, sizes = padded_tokens(height, width, channels)
    calls = {}
    for label, options in methods:
        if options is None:
            calls[label] = lambda: float64_floor(tokens)
        else:
            conditioner = TokenConditioner(**options)
            calls[label] = (lambda c: lambda: c(tokens, hw_shape=(height, width), valid_shapes=sizes))(conditioner)
    times = {label: [] for label in calls}
    with torch.no_grad():
        for call in calls.values():  # warm-up
            call()
        for _ in tqdm(range(repeats), desc=f'{height}x{width}x{channels}', file=sys.stderr, leave=False):
            for label, call in calls.items():
                start = time.perf_counter()
                call()
                times[label].append(time.perf_counter() - start)
    floor = min(times['float64 floor'])
    with torch.no_grad():
        eigh_correction = calls['batched, eigh']().double() - tokens.double() if 'batched, eigh' in calls else None
    rows = []
    for label, call in calls.items():
        ops = count_ops(call, 'cpu')
        top_ops = profile_call(call) if profile and label in PROFILED else None
        gap = None
        if label in SAME_MAP and eigh_correction is not None:
            with torch.no_grad():
                gap = ((call().double() - tokens.double() - eigh_correction).norm() / eigh_correction.norm()).item()
        rows.append(dict(grid=[height, width], channels=channels, batch=2, method=label,
                         ms=1e3 * min(times[label]), times_ms=[1e3 * t for t in times[label]],
                         floor_ratio=min(times[label]) / floor, aten_ops=ops['aten_ops'],
                         host_reads=ops['host_reads'], passes=count_bytes(call, tokens.numel())['passes'],
                         peak_extra=peak_extra_bytes(call) / tokens.nbytes, gap_to_eigh=gap, profile=top_ops))
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--grids', nargs='+', type=_grid, default=[(200, 336, 96), (64, 64, 768)], metavar='HxWxD',
                        help='token grids and channels (default: Swin-T 200x336x96 and ViTDet-B 64x64x768)')
    parser.add_argument('--repeats', type=int, help='timed calls per method (default: 5 on the CPU, 20 on CUDA)')
    parser.add_argument('--skip-reference', action='store_true', help='leave out the one-image-at-a-time reference')
    parser.add_argument('--profile', action='store_true',
                        help='also break one call of each batched solver down by aten op on the CPU, by kernel on '
                        'CUDA (the first batch size; torch.profiler)')
    parser.add_argument('--device', default='cpu', choices=['cpu', 'cuda'])
    parser.add_argument('--batches', nargs='+', type=int, default=[2, 8],
                        help='batch sizes on CUDA (default: 2 8; the CPU measures B = 2)')
    parser.add_argument('--compile-batches', nargs='*', type=int, default=[2],
                        help='the batch sizes also measured under torch.compile on CUDA (default: 2)')
    parser.add_argument('--budget-s', type=float, default=float('inf'),
                        help='on CUDA, seconds after which only eager calls are measured (compiles and graph '
                        'captures are skipped, and say so); the JSON is rewritten after every row')
    parser.add_argument('--out-dir', default='work_dirs/conditioner_cost')
    args = parser.parse_args(argv)
    if args.device == 'cuda':
        args.repeats = args.repeats or 20
        return main_cuda(args, argv)
    args.repeats = args.repeats or 5
    methods = [m for m in METHODS if not (args.skip_reference and m[0] == 'reference (gram)')]
    machine = f'{platform.processor() or platform.machine()}, torch {torch.__version__}, {torch.get_num_threads()} threads'
    print(machine)
    rows = [row for grid in args.grids for row in measure(*grid, args.repeats, methods, args.profile)]
    print(f'{"grid":>12} {"method":>22} {"ms":>9} {"x floor":>8} {"aten calls":>11} {"host reads":>11} {"passes":>7} '
          f'{"peak (x X)":>10} {"gap to eigh":>11}')
    for row in rows:
        grid = f'{row["grid"][0]}x{row["grid"][1]}x{row["channels"]}'
        print(f'{grid:>12} {row["method"]:>22} {row["ms"]:9.1f} {row["floor_ratio"]:8.2f} {row["aten_ops"]:11d} '
              f'{row["host_reads"]:11d} {row["passes"]:7.1f} {row["peak_extra"]:10.2f} '
              f'{"" if row["gap_to_eigh"] is None else format(row["gap_to_eigh"], ".1e"):>11}')
    for row in rows:
        if row['profile']:
            print(f'{row["grid"][0]}x{row["grid"][1]}x{row["channels"]} {row["method"]}, one call by op: '
                  + ', '.join(f'{e["op"]} {e["ms"]:.1f} ms ({e["calls"]})' for e in row['profile']))
    os.makedirs(args.out_dir, exist_ok=True)
    with open(osp.join(args.out_dir, 'conditioner_cost.json'), 'w') as f:
        json.dump(dict(command='python tools/benchmark/conditioner_cost.py ' + ' '.join(argv or sys.argv[1:]),
                       machine=machine, rows=rows), f, indent=1)
    grids = sorted({(r['grid'][0], r['grid'][1], r['channels']) for r in rows}, key=lambda g: g[0] * g[1] * g[2])
    figure, axis = plt.subplots(figsize=(7, 3.5))
    width = 0.8 / len(methods)
    for i, (label, _) in enumerate(methods):
        values = [next(r['floor_ratio'] for r in rows if r['method'] == label
                       and (r['grid'][0], r['grid'][1], r['channels']) == g) for g in grids]
        axis.bar([k + i * width for k in range(len(grids))], values, width, label=label)
    axis.set_xticks([k + width * (len(methods) - 1) / 2 for k in range(len(grids))],
                    [f'{h}x{w}, d {d}' for h, w, d in grids])
    axis.set_ylabel('time / float64 floor')
    axis.set_yscale('log')
    axis.legend(fontsize=8)
    axis.set_title('TokenConditioner on the CPU, B = 2 padded', fontsize=9)
    figure.tight_layout()
    figure.savefig(osp.join(args.out_dir, 'conditioner_cost.png'), dpi=120)
    print(f'wrote conditioner_cost.json and conditioner_cost.png in {args.out_dir}')


def commit() -> str:
    """$CONDTOK_COMMIT where it is set (a copy of the working tree on another machine, whose git metadata, if any,
    need not be the tree's), else the commit of the checkout this package is imported from (and '-dirty' with
    uncommitted changes)."""
    if os.environ.get('CONDTOK_COMMIT'):
        return os.environ['CONDTOK_COMMIT']
    try:
        root = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
        head = subprocess.run(['git', '-C', root, 'rev-parse', 'HEAD'], capture_output=True, text=True, check=True)
        dirty = subprocess.run(['git', '-C', root, 'status', '--porcelain'], capture_output=True, text=True).stdout
        return head.stdout.strip() + ('-dirty' if dirty.strip() else '')
    except (OSError, subprocess.CalledProcessError):
        return 'unknown'


def main_cuda(args, argv):
    from .conditioner_cuda import EXECUTIONS, machine, measure_grid
    deadline = time.monotonic() + args.budget_s
    os.makedirs(args.out_dir, exist_ok=True)
    result = dict(command='python tools/benchmark/conditioner_cost.py ' + ' '.join(argv or sys.argv[1:]),
                  commit=commit(), machine=machine(), rows=[])
    path = osp.join(args.out_dir, 'conditioner_cost.json')

    def save(row):
        result['rows'].append(row)
        with open(path, 'w') as f:
            json.dump(result, f, indent=1)

    cases = [(grid, batch) for grid in args.grids for batch in args.batches]
    for (height, width, channels), batch in tqdm(cases, desc='grids x batches', file=sys.stderr):
        executions = EXECUTIONS if batch in args.compile_batches else tuple(e for e in EXECUTIONS if e != 'compile')
        measure_grid(height, width, channels, batch, args.repeats, executions, deadline=deadline, progress=save,
                     profiled=PROFILED if args.profile and batch == args.batches[0] else ())
    print(result['machine'])
    print(f'{"grid":>12} {"B":>2} {"method":>22} {"execution":>9} {"ms/image":>9} {"kernels":>8} {"syncs":>6} '
          f'{"sync-free":>9} {"peak (x X)":>10} {"kappa max":>9} {"gap to eigh":>11}')
    for row in result['rows']:
        grid = f'{row["grid"][0]}x{row["grid"][1]}x{row["channels"]}'
        head = f'{grid:>12} {row["batch"]:>2} {row["method"]:>22} {row["execution"]:>9}'
        if 'ms_per_image' not in row:
            print(f'{head} {row.get("error", "")}')
            continue
        print(f'{head} {row["ms_per_image"]:9.3f} {row.get("cuda_kernels", ""):>8} {row.get("cuda_syncs", ""):>6} '
              f'{"yes" if row.get("sync_error") is None else "no":>9} {row.get("peak_extra", float("nan")):10.2f} '
              f'{"" if row["kappa_max"] is None else format(row["kappa_max"], ".6f"):>9} '
              f'{"" if row.get("gap_to_eigh") is None else format(row["gap_to_eigh"], ".1e"):>11}')
    for row in result['rows']:
        if row.get('profile'):
            print(f'{row["grid"][0]}x{row["grid"][1]}x{row["channels"]} B {row["batch"]} {row["method"]}, one call by '
                  'kernel: ' + ', '.join(f'{e["kernel"][:60]} {e["ms"]:.2f} ms ({e["calls"]})' for e in row['profile']))
    plot_cuda(result['rows'], osp.join(args.out_dir, 'conditioner_cost.png'), result['machine']['device'])
    print(f'wrote conditioner_cost.json and conditioner_cost.png in {args.out_dir}')


def plot_cuda(rows, path, device):
    """ms per image of each method and execution, one panel per grid and batch (log scale)."""
    panels = sorted({(r['grid'][0], r['grid'][1], r['channels'], r['batch']) for r in rows})
    figure, axes = plt.subplots(1, len(panels), figsize=(3.2 * len(panels), 3.8), squeeze=False)
    for axis, (height, width, channels, batch) in zip(axes[0], panels):
        measured = [r for r in rows if (r['grid'][0], r['grid'][1], r['channels'], r['batch'])
                    == (height, width, channels, batch) and 'ms_per_image' in r]
        axis.barh(range(len(measured)), [r['ms_per_image'] for r in measured])
        axis.set_yticks(range(len(measured)), [f'{r["method"]}, {r["execution"]}' for r in measured], fontsize=6)
        axis.set_xscale('log')
        axis.set_xlabel('ms per image')
        axis.set_title(f'{height}x{width}, d {channels}, B {batch}', fontsize=8)
    figure.suptitle(f'the conditioner on {device}', fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


if __name__ == '__main__':
    main()
