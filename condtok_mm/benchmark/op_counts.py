"""What one call costs besides its time: the ops it launches, the host syncs it forces, its float64 FLOPs.

``count_ops(fn, device)`` calls ``fn()`` once (warm it up first) and returns:

- ``aten_ops``: the aten ops it dispatches, as a ``TorchDispatchMode`` sees them (below autograd, after
  composite ops are decomposed; views included, an op's own internal calls not). On the CPU these are its
  launches: each one is a kernel call with its Python and dispatcher overhead.
- ``host_reads``: the ops among them that make the host wait for a tensor's value on a GPU: reads
  (``_local_scalar_dense``, i.e. ``.item()``, ``bool()``, ``float()``), ops whose output size depends on the
  values (``nonzero``, ``masked_select``, ``unique``, indexing with a boolean mask, ...) and the linalg ops
  whose CUDA kernels read their error codes back to check them (``_linalg_check_errors`` in pytorch's
  aten/src/ATen/native/BatchLinearAlgebra.cpp: dispatched by ``cholesky``, ``inv``, ``solve`` without
  ``_ex``; inside ``_linalg_eigh`` and ``_linalg_svd``, which ``eigh``, ``eigvalsh``, ``svd`` and
  ``svdvals`` call).
  Counted by name, the same on every device: it is what the code would make a GPU do.
- ``float64_flops``: floating-point operations done in float64: matrix products by
  ``torch.utils.flop_counter``'s formulas (2 m n k for an m x k by k x n product), decompositions by
  Golub & Van Loan's counts (Matrix Computations, 4th ed.: symmetric eigendecomposition with vectors
  9 n^3, values only 4/3 n^3 (torch 2.14's ``eigvalsh`` computes the vectors too); thin SVD of m x n,
  m >= n, min(14 m n^2 + 8 n^3, 6 m n^2 + 20 n^3) with vectors, 4 m n^2 - 4/3 n^3 without; Cholesky
  n^3 / 3; triangular solve n^2 k; LU solve 2/3 n^3 + 2 n^2 k; inverse 2 n^3; Householder QR with Q
  4 m n^2 - 4/3 n^3), pointwise ops and reductions one per element. A consumer GPU runs float64 at 1/32 to
  1/64 of its float32 rate, so these are what such a GPU pays most for.

On CUDA it also runs ``fn()`` under ``torch.profiler`` and adds:

- ``cuda_kernels``: the kernels that ran on the GPU (the profiler's CUDA activity, memcpy and memset
  excluded), library kernels (cuBLAS, cuSOLVER) included;
- ``cuda_syncs``: the CUDA runtime/driver calls that block the host (stream/device/event synchronize and
  synchronous ``cudaMemcpy``), also those made inside libraries.

Both are counts of ``fn()`` minus those of an empty profiled region (the profiler's own synchronisation).
"""
import math
from typing import Any, Callable, Dict

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

aten = torch.ops.aten
# Ops whose output needs a value (or a size that depends on values) on the host.
VALUE_READS = {aten._local_scalar_dense, aten.nonzero, aten.nonzero_static, aten.masked_select, aten._unique,
               aten._unique2, aten.unique_dim, aten.unique_consecutive, aten.unique_dim_consecutive,
               aten.repeat_interleave, aten.bincount, aten.histc, aten.masked_scatter, aten.is_nonzero,
               aten.equal, aten.allclose, aten._linalg_check_errors}
# linalg ops whose kernels read their CUDA info codes back to the host to raise on a failed decomposition
# (the others dispatch _linalg_check_errors, counted above).
CHECKED_LINALG = {aten._linalg_eigh, aten._linalg_svd}
REDUCTIONS = {aten.sum, aten.mean, aten.amax, aten.amin, aten.max, aten.min, aten.prod, aten.cumsum, aten.norm,
              aten.linalg_vector_norm, aten.var, aten.std, aten.var_mean, aten.std_mean, aten.logsumexp}
DECOMPOSITIONS = {aten._linalg_eigh, aten._linalg_svd, aten.linalg_cholesky_ex, aten.linalg_inv_ex,
                  aten.linalg_solve_triangular, aten._linalg_solve_ex, aten.linalg_qr, aten.geqrf}
CUDA_SYNC_CALLS = {'cudaStreamSynchronize', 'cudaDeviceSynchronize', 'cudaEventSynchronize', 'cudaMemcpy',
                   'cudaMemcpy2D', 'cuStreamSynchronize', 'cuCtxSynchronize', 'cuEventSynchronize', 'cuMemcpyDtoH',
                   'cuMemcpyDtoH_v2'}


def _is_bool_mask_index(func, args) -> bool:
    """``x[mask]`` / ``x[mask] = v``: the indices of a boolean mask are found on the host."""
    if func.overloadpacket not in (aten.index, aten.index_put, aten.index_put_, aten._index_put_impl_):
        return False
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1] if i is not None)


def _decomposition_flops(packet, args, out) -> float:
    """Golub & Van Loan's flop counts for the DECOMPOSITIONS (whether vectors were computed: from ``out``)."""
    a = args[0]
    batch = math.prod(a.shape[:-2])
    m, n = a.shape[-2:]
    if packet is aten._linalg_eigh:  # (eigenvalues, eigenvectors: empty without compute_v)
        return batch * (9 * n**3 if out[1].numel() else 4 / 3 * n**3)
    if packet is aten._linalg_svd:  # (U, S, Vh: U and Vh empty without compute_uv)
        m, n = max(m, n), min(m, n)
        return batch * (min(14 * m * n**2 + 8 * n**3, 6 * m * n**2 + 20 * n**3) if out[0].numel()
                        else 4 * m * n**2 - 4 / 3 * n**3)
    if packet is aten.linalg_cholesky_ex:
        return batch * n**3 / 3
    if packet is aten.linalg_inv_ex:
        return batch * 2 * n**3
    b = args[1] if len(args) > 1 else None  # the right-hand sides of a solve: n x k (or a vector)
    right_hand_sides = b.numel() // n if isinstance(b, torch.Tensor) else 0
    if packet is aten.linalg_solve_triangular:
        return n**2 * right_hand_sides
    if packet is aten._linalg_solve_ex:
        return batch * 2 / 3 * n**3 + 2 * n**2 * right_hand_sides
    if packet in (aten.linalg_qr, aten.geqrf):
        m, n = max(m, n), min(m, n)
        return batch * (4 * m * n**2 - 4 / 3 * n**3)
    raise NotImplementedError(packet)


def _tensors(tree):
    """The tensors in ``tree``, a tensor or lists, tuples and dicts of them."""
    if isinstance(tree, torch.Tensor):
        yield tree
    elif isinstance(tree, (list, tuple)):
        for item in tree:
            yield from _tensors(item)
    elif isinstance(tree, dict):
        for item in tree.values():
            yield from _tensors(item)


class OpCounter(TorchDispatchMode):
    """Counts the aten ops dispatched inside it, the host reads among them and their float64 FLOPs."""

    def __init__(self):
        super().__init__()
        self.aten_ops = 0
        self.host_reads = 0
        self.float64_flops = 0.0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        packet = func.overloadpacket
        self.aten_ops += 1
        if packet in VALUE_READS or packet in CHECKED_LINALG or _is_bool_mask_index(func, args):
            self.host_reads += 1
        tensors = list(_tensors(list(args) + list(kwargs.values()))) + list(_tensors(out))
        if any(t.dtype == torch.float64 for t in tensors):
            if packet in flop_registry:
                self.float64_flops += flop_registry[packet](*args, **kwargs, out_val=out)
            elif torch.Tag.pointwise in func.tags:
                self.float64_flops += max(t.numel() for t in tensors)
            elif packet in REDUCTIONS:
                self.float64_flops += args[0].numel()
            elif packet in DECOMPOSITIONS:
                self.float64_flops += _decomposition_flops(packet, args, out)
        return out


def _cuda_profile(fn: Callable[[], Any]) -> Dict[str, int]:
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    events = prof.events()
    kernels = sum(1 for e in events if e.device_type == DeviceType.CUDA and not e.name.startswith(('Memcpy', 'Memset')))
    syncs = sum(1 for e in events if e.device_type == DeviceType.CPU and e.name in CUDA_SYNC_CALLS)
    return dict(cuda_kernels=kernels, cuda_syncs=syncs)


def count_ops(fn: Callable[[], Any], device: str = 'cpu') -> Dict[str, Any]:
    """The counts above for one call of ``fn`` (see the module docstring)."""
    with torch.no_grad(), OpCounter() as counter:
        fn()
    counts = dict(aten_ops=counter.aten_ops, host_reads=counter.host_reads, float64_flops=int(counter.float64_flops))
    if str(device).startswith('cuda'):
        with torch.no_grad():
            measured, empty = _cuda_profile(fn), _cuda_profile(lambda: None)
        counts.update({key: measured[key] - empty[key] for key in measured})
    return counts
