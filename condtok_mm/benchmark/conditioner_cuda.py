"""The conditioner on a CUDA device: what ``tools/benchmark/conditioner_cost.py --device cuda`` measures. It imports
nothing but torch and :mod:`condtok_mm.conditioning`, so that it runs where the OpenMMLab stack is not installed.

For each token grid and batch size: a padded batch of LayerNorm'd random token grids (B, H, W, d) (the odd images'
valid regions 3/4 x 2/3 of the grid), conditioned by

- the float64 floor (cast X to float64, the d x d Gram matrix, one N x d x d product, cast back),
- the batched path with ``solver='eigh'`` and with ``solver='newton_schulz'`` (the functional API,
  :func:`condtok_mm.conditioning.condition_valid_regions`, what TokenConditioner calls),
- Token Graying's SVD form (``mode='graying'``, the batched path),
- the float32 SVD form: the paper's C = s_1 U V^T from ``torch.linalg.svd`` of each image's valid region in float32,
  one image at a time (what a direct implementation does),

each run eager, compiled (``torch.compile``, static shapes) and replayed from a CUDA graph where it can be (the
error is recorded where it cannot). Per row: ms per image (CUDA events around each call, after warm-up calls; the
median of ``repeats``), the kernels launched and the host syncs of one call (``op_counts.count_ops``: the
profiler's CUDA kernels and its blocking CUDA calls), whether one call runs under
``torch.cuda.set_sync_debug_mode('error')`` without raising, the peak memory one call allocates in units of X in
float32, the largest kappa of a conditioned valid region (float64 SVD), and for Newton-Schulz its gap to eigh,
||(X + C)_newton_schulz - (X + C)_eigh||_F / ||C_eigh||_F.
"""
import statistics
import time
import traceback
from typing import Callable, Dict, List, Optional

import torch

from condtok_mm import conditioning
from .op_counts import count_ops

EXECUTIONS = ('eager', 'compile', 'graph')
# label: (options of the batched path, or None for the callables below; the executions it is run in)
METHODS = {
    'float64 floor': (None, ('eager', )),
    'batched, eigh': (dict(solver='eigh'), EXECUTIONS),
    'batched, newton_schulz': (dict(solver='newton_schulz'), EXECUTIONS),
    'graying, SVD form': (dict(mode='graying'), ('eager', )),
    'float32 SVD form': (None, ('eager', )),
}

# The methods whose output is bounded, kappa <= 2 on each valid region.
BOUNDED = ('batched, eigh', 'batched, newton_schulz', 'float32 SVD form')


def padded_grids(height: int, width: int, channels: int, batch: int, device: str, seed: int = 0):
    """LayerNorm'd random token grids (B, H, W, d) on ``device`` and their valid sizes (B, 2): the even images whole,
    the odd ones on the top-left 3/4 x 2/3 of the grid."""
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.nn.functional.layer_norm(torch.randn(batch, height, width, channels, generator=generator),
                                            (channels, ))
    sizes = torch.tensor([[height, width] if b % 2 == 0 else [height * 3 // 4, width * 2 // 3]
                          for b in range(batch)])
    return tokens.to(device), sizes.to(device)


def float64_floor(grid: torch.Tensor) -> torch.Tensor:
    """Cast, Gram matrix, one product per image, cast back: what a float64 conditioner cannot avoid."""
    x = grid.flatten(1, 2).double()
    return (x @ (x.transpose(-1, -2) @ x)).to(grid.dtype).view(grid.shape)


def float32_svd_form(grid: torch.Tensor, sizes: List[List[int]]) -> torch.Tensor:
    """X + s_1 U V^T on each image's valid region, from a float32 thin SVD, one image at a time."""
    out = grid.clone()
    for b, (h, w) in enumerate(sizes):
        x = grid[b, :h, :w].reshape(h * w, -1)
        u, s, vh = torch.linalg.svd(x, full_matrices=False)
        out[b, :h, :w] = (x + s[0] * (u @ vh)).view(h, w, -1)
    return out


def method_call(label: str, grid: torch.Tensor, sizes: torch.Tensor) -> Callable[[], torch.Tensor]:
    options = METHODS[label][0]
    if label == 'float64 floor':
        return lambda: float64_floor(grid)
    if label == 'float32 SVD form':
        host_sizes = sizes.tolist()
        return lambda: float32_svd_form(grid, host_sizes)
    resolved = conditioning.ConditioningOptions(where=label, **options)
    return lambda: conditioning.condition_valid_regions(grid, sizes, options=resolved)


def times_ms(call: Callable[[], torch.Tensor], repeats: int, device: str, warmup: int = 3) -> List[float]:
    """Milliseconds of each of ``repeats`` calls after ``warmup`` calls: by CUDA events on the current stream on a
    GPU, by the wall clock on the CPU."""
    for _ in range(warmup):
        call()
    times = []
    for _ in range(repeats):
        if device == 'cuda':
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            call()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            started = time.perf_counter()
            call()
            times.append(1e3 * (time.perf_counter() - started))
    return times


def graph_replay(call: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
    """``call`` captured once in a CUDA graph (warmed up on a side stream, as capture requires); the replay."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            call()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call()

    def replay():
        graph.replay()
        return out

    return replay


def runs_without_sync(call: Callable[[], torch.Tensor]) -> Optional[str]:
    """None where one call runs under set_sync_debug_mode('error'), else the error it raised."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode('error')
    try:
        call()
    except RuntimeError as error:
        return str(error).splitlines()[0]
    finally:
        torch.cuda.set_sync_debug_mode('default')
    return None


def peak_extra(call: Callable[[], torch.Tensor], x_bytes: int) -> float:
    """The most memory one call allocates beyond what is allocated before it, in units of ``x_bytes``."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out = call()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    del out
    return peak / x_bytes


def kernel_profile(call: Callable[[], torch.Tensor], rows: int = 8) -> List[Dict]:
    """The kernels that take the most GPU time in one call (torch.profiler): name, ms, launches."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as profiler:
        call()
        torch.cuda.synchronize()
    events = [e for e in profiler.key_averages() if getattr(e, 'self_device_time_total', 0) > 0]
    events.sort(key=lambda e: e.self_device_time_total, reverse=True)
    return [dict(kernel=e.key[:120], ms=e.self_device_time_total / 1e3, calls=e.count) for e in events[:rows]]


def largest_kappa(out: torch.Tensor, sizes: torch.Tensor) -> float:
    """The largest kappa of a conditioned valid region of ``out`` (float64 singular values)."""
    return max(float(conditioning.condition_number(out[b, :h, :w].reshape(h * w, -1)))
               for b, (h, w) in enumerate(sizes.tolist()))


def measure_grid(height: int, width: int, channels: int, batch: int, repeats: int, executions=EXECUTIONS,
                 labels=tuple(METHODS), deadline: float = float('inf'), progress=None, device: str = 'cuda',
                 profiled=()) -> List[Dict]:
    """One row per method and execution at this grid and batch (see the module docstring), each passed to
    ``progress`` as it is made. Executions other than eager are skipped (and say so) once ``time.monotonic()``
    passes ``deadline``. ``device='cpu'`` runs the same rows without what only CUDA has (graphs, sync checks, kernel
    counts, peak memory): a rehearsal of the script where there is no GPU. The eager rows of the methods in
    ``profiled`` also list their costliest kernels (CUDA only)."""
    grid, sizes = padded_grids(height, width, channels, batch, device)
    x_bytes = grid.numel() * 4
    rows, outputs = [], {}
    for label in labels:
        for execution in executions:
            if execution not in METHODS[label][1]:
                continue
            row = dict(grid=[height, width], channels=channels, batch=batch, method=label, execution=execution)
            rows.append(row)
            if execution != 'eager' and time.monotonic() > deadline:
                row['error'] = 'skipped: past the time budget (--budget-s)'
                continue
            eager = next(r for r in rows if r['method'] == label and r['execution'] == 'eager')
            if execution == 'graph' and eager.get('sync_error', 'not measured') is not None:
                # a call that waits on the host cannot be captured, and a failed capture can leave the device's
                # stream unusable for the rows after it
                row['error'] = 'skipped: the eager call is not sync-free, so it cannot be captured'
                continue
            try:
                with torch.no_grad():
                    call = method_call(label, grid, sizes)
                    started = time.monotonic()
                    if execution == 'compile':
                        call = torch.compile(call, dynamic=False)
                        call()
                    elif execution == 'graph':
                        call = graph_replay(call)
                    row['prepare_s'] = time.monotonic() - started
                    times = times_ms(call, repeats, device)
                    row.update(ms_per_image=statistics.median(times) / batch, times_ms=times)
                    if execution != 'graph':
                        row.update(count_ops(call, device))
                    if device == 'cuda':
                        row['sync_error'] = runs_without_sync(call) if execution != 'graph' else None
                        row['peak_extra'] = peak_extra(call, x_bytes)
                        if execution == 'eager' and label in profiled:
                            row['profile'] = kernel_profile(call)
                    out = call().clone()
                    row['kappa_max'] = largest_kappa(out, sizes) if label in BOUNDED else None
                    if execution == 'eager':
                        outputs[label] = out
            except Exception as error:  # recorded beside the others: a path that cannot run is a result here
                row['error'] = f'{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ""}'
                row['traceback_tail'] = traceback.format_exc()[-2000:]
            if progress is not None:
                progress(row)
    if 'batched, eigh' in outputs:
        eigh = outputs['batched, eigh'].double()
        correction = eigh - grid.double()
        for row in rows:
            if row['method'] == 'batched, newton_schulz' and 'ms_per_image' in row and row['execution'] == 'eager':
                ns = outputs['batched, newton_schulz'].double()
                row['gap_to_eigh'] = float((ns - eigh).norm() / correction.norm())
    return rows


def machine() -> Dict[str, str]:
    properties = torch.cuda.get_device_properties(0)
    return dict(device=torch.cuda.get_device_name(0), memory_gib=round(properties.total_memory / 2**30, 1),
                torch=torch.__version__, cuda=torch.version.cuda, cudnn=str(torch.backends.cudnn.version()))
