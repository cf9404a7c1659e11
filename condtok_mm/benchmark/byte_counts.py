"""How many times one call moves the token matrix through memory: the bytes its aten ops read and write on
tensors of the tokens' size, in passes of one float32 read of X.

    python tools/benchmark/byte_counts.py [--grids 200x336x96 64x64x768] [--solvers eigh newton_schulz]
        [--top 12] [--out-dir work_dirs/byte_counts]

``count_bytes(fn, tokens_numel)`` calls ``fn()`` once under a ``TorchDispatchMode`` and sums, for every aten op,
the bytes of its tensor arguments (read) and of its results (written) that lie on storages of at least half as many
elements as the tokens (``tokens_numel``, e.g. B x N x d): the N x d-sized traffic that a memory-bound kernel pays
for, a chunk of X read or written through a view included; d x d matrices, per-image vectors and chunk-sized
temporaries (which stay in cache) are left out. A view (a result that aliases an argument without writing it:
``view``, ``transpose``, ``expand``, ``_unsafe_view``, ...) moves nothing; an in-place op reads its arguments and writes the one it
changes; ``copy_``, ``fill_`` and ``zero_`` do not read what they overwrite, ``zeros_like`` and its kin read nothing,
``empty_like`` moves nothing, and a gather (``index_select``, ``gather``) reads the rows it returns, not its whole
source. ``passes`` is the sum divided by
4 * tokens_numel, one float32 pass over X: a cast of float32 X to float64 is 3 (4 bytes read, 8 written), a
float32 clone 2. It counts what the ops ask for, not what a fused or cached kernel moves, so it is the same on
every device.

``peak_extra_bytes(fn)`` is the most bytes one call holds at once in storages its ops allocate (from the op that
makes a storage until the last tensor object on it is gone; the result it returns included): on the CPU, where
torch keeps no allocator statistics, the extra memory a call needs.

The script counts TokenConditioner on LayerNorm'd padded batches (B = 2, image 1 valid on 3/4 x 2/3 of the grid),
prints each grid's passes, its peak extra memory in units of X in float32, and the ops that move most, and writes
byte_counts.json next to the table.
"""
import argparse
import collections
import json
import os
import os.path as osp
import sys
import weakref
from typing import Any, Callable, Dict

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from condtok_mm.models.token_conditioner import TokenConditioner
from .op_counts import _tensors

aten = torch.ops.aten
# In-place ops that overwrite their first argument without reading it.
OVERWRITES = {aten.copy_, aten.fill_, aten.zero_}
# Ops that take a tensor for its shape only: they read none of it (and the empty ones write nothing either).
SHAPE_ONLY = {aten.zeros_like, aten.ones_like, aten.full_like, aten.empty_like, aten.new_empty, aten.new_zeros,
              aten.new_ones, aten.new_full, aten.new_empty_strided}
UNINITIALISED = {aten.empty_like, aten.new_empty, aten.new_empty_strided}
# Gathers read only the rows they return (plus their index), not the whole source.
GATHERS = {aten.index_select, aten.gather}
# Views whose schema does not say so (reshape's view of a tensor it has just copied, counted at the copy).
UNMARKED_VIEWS = {aten._unsafe_view, aten.alias}


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


class ByteCounter(TorchDispatchMode):
    """Sums the bytes read and written by the aten ops dispatched inside it on tensors of >= ``min_elements``."""

    def __init__(self, min_elements: int):
        super().__init__()
        self.min_elements = min_elements
        self.read = self.written = 0
        self.by_op = collections.Counter()

    def _large(self, tensor: torch.Tensor) -> bool:
        """On a storage of at least ``min_elements``: the tokens' size, or a slice of it (a chunk of X)."""
        return tensor.untyped_storage().nbytes() >= self.min_elements * tensor.element_size()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        schema = func._schema
        returns_alias = [r.alias_info for r in schema.returns]
        if func.overloadpacket in UNMARKED_VIEWS or func.overloadpacket in UNINITIALISED or (
                returns_alias and all(info is not None and not info.is_write for info in returns_alias)):
            return out  # a view: nothing moves
        mutated = [a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
        named = dict(zip((a.name for a in schema.arguments), args), **kwargs)
        if func.overloadpacket in SHAPE_ONLY:
            read = 0
        elif func.overloadpacket in GATHERS:
            read = sum(_nbytes(t) for t in _tensors(out) if self._large(t)) + sum(
                _nbytes(t) for t in _tensors(named.get('index')) if self._large(t))
        else:
            read = sum(_nbytes(t) for name, value in named.items()
                       if not (func.overloadpacket in OVERWRITES and name in mutated)
                       for t in _tensors(value) if self._large(t))
        if mutated:  # in place (or out=): it writes the arguments it changes, returns aliases of them
            written = sum(_nbytes(t) for name in mutated for t in _tensors(named.get(name))
                          if self._large(t))
        else:
            written = sum(_nbytes(t) for t in _tensors(out) if self._large(t))
        self.read += read
        self.written += written
        if read or written:
            self.by_op[func.overloadpacket.__name__] += read + written
        return out


class LiveBytes(TorchDispatchMode):
    """The peak of the bytes held by storages that the ops dispatched inside it allocate: a storage counts from the
    op that makes it until the last tensor object on it (its views included) is gone. What the caller passed in
    and what it keeps are not new; the result a call returns is, until the caller drops it."""

    def __init__(self):
        super().__init__()
        self.holders = {}  # storage address -> [tensor objects on it, bytes]
        self.live = self.peak = 0

    def _release(self, key):
        entry = self.holders[key]
        entry[0] -= 1
        if entry[0] == 0:
            self.live -= entry[1]
            del self.holders[key]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        given = {t.untyped_storage().data_ptr() for t in _tensors([args, kwargs])}
        for tensor in _tensors(out):
            key = tensor.untyped_storage().data_ptr()
            if key == 0 or (key in given and key not in self.holders):
                continue  # empty, or on a storage from outside (a view of an argument, an in-place result)
            entry = self.holders.get(key)
            if entry is None:
                entry = self.holders[key] = [0, tensor.untyped_storage().nbytes()]
                self.live += entry[1]
                self.peak = max(self.peak, self.live)
            entry[0] += 1
            weakref.finalize(tensor, self._release, key)
        return out


def peak_extra_bytes(fn: Callable[[], Any]) -> int:
    """The most bytes that one call of ``fn`` holds at once in storages it allocates (:class:`LiveBytes`)."""
    with torch.no_grad(), LiveBytes() as counter:
        fn()
    return counter.peak


def count_bytes(fn: Callable[[], Any], tokens_numel: int) -> Dict[str, Any]:
    """Bytes read and written by one call of ``fn`` on tensors of at least ``tokens_numel / 2`` elements, and
    ``passes``: their sum in units of one float32 pass over ``tokens_numel`` elements (see the module)."""
    with torch.no_grad(), ByteCounter(max(1, tokens_numel // 2)) as counter:
        fn()
    unit = 4 * tokens_numel
    return dict(bytes_read=counter.read, bytes_written=counter.written,
                passes=(counter.read + counter.written) / unit,
                passes_by_op={name: count / unit for name, count in counter.by_op.most_common()})


def padded_tokens(height: int, width: int, channels: int, seed: int = 0):
    """LayerNorm'd random tokens (2, H*W, d), and the valid sizes of a padded batch (image 1 on 3/4 x 2/3)."""
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.nn.functional.layer_norm(torch.randn(2, height * width, channels, generator=generator),
                                            (channels, ))
    return tokens, [(height, width), (height * 3 // 4, width * 2 // 3)]


def conditioner_passes(height: int, width: int, channels: int, solver: str) -> Dict[str, Any]:
    """count_bytes of one TokenConditioner(solver=...) call on a padded batch of that grid, and ``peak_extra``: the
    most bytes it holds at once in storages it allocates, in units of X in float32 (tokens.nbytes)."""
    tokens, sizes = padded_tokens(height, width, channels)
    conditioner = TokenConditioner(solver=solver)

    def call():
        return conditioner(tokens, hw_shape=(height, width), valid_shapes=sizes)

    return dict(count_bytes(call, tokens.numel()), peak_extra=peak_extra_bytes(call) / tokens.nbytes)


def _grid(text: str):
    height, width, channels = (int(v) for v in text.lower().split('x'))
    return height, width, channels


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--grids', nargs='+', type=_grid, default=[(200, 336, 96), (64, 64, 768)],
                        metavar='HxWxD', help='token grids and channels (default: Swin-T 200x336x96, ViTDet-B '
                        '64x64x768)')
    parser.add_argument('--solvers', nargs='+', default=['eigh', 'newton_schulz'], choices=['eigh', 'newton_schulz'])
    parser.add_argument('--top', type=int, default=12, help='ops listed per row (default: 12)')
    parser.add_argument('--out-dir', default='work_dirs/byte_counts')
    args = parser.parse_args(argv)
    from tqdm import tqdm
    rows = []
    cases = [(grid, solver) for grid in args.grids for solver in args.solvers]
    for (height, width, channels), solver in tqdm(cases, desc='byte counts', file=sys.stderr):
        counts = conditioner_passes(height, width, channels, solver)
        rows.append(dict(grid=[height, width], channels=channels, batch=2, solver=solver, **counts))
    print(f'{"grid":>12} {"solver":>14} {"passes":>7} {"peak (x X)":>10}  largest movers (passes)')
    for row in rows:
        movers = ', '.join(f'{name} {value:.1f}' for name, value in list(row['passes_by_op'].items())[:args.top])
        grid = f'{row["grid"][0]}x{row["grid"][1]}x{row["channels"]}'
        print(f'{grid:>12} {row["solver"]:>14} {row["passes"]:7.1f} {row["peak_extra"]:10.2f}  {movers}')
    os.makedirs(args.out_dir, exist_ok=True)
    path = osp.join(args.out_dir, 'byte_counts.json')
    with open(path, 'w') as f:
        json.dump(dict(command='python tools/benchmark/byte_counts.py ' + ' '.join(argv or sys.argv[1:]),
                       torch=torch.__version__, rows=rows), f, indent=1)
    print(f'wrote {path}')


if __name__ == '__main__':
    main()
