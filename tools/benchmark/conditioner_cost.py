"""CPU cost of TokenConditioner on Swin-T-sized tokens: the float64 reference (method='gram', one image at a time)
against the batched path (the default), with the aten calls and host reads of one call.

    PYTHONPATH=$PWD python tools/benchmark/conditioner_cost.py [--repeats 5]

Tokens: LayerNorm'd random (B=2, H*W, 96) grids, image 1 padded (its valid region 3/4 x 2/3 of the grid).
Prints one row per grid and method: median wall time of --repeats calls, aten calls, host reads
(aten._local_scalar_dense, nonzero, ...). The numbers are this machine's; the lead records the command.
"""
import argparse
import platform
import statistics
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from condtok_mm.models.token_conditioner import TokenConditioner

HOST_READS = {'_local_scalar_dense', 'nonzero', 'masked_select', 'unique', '_unique2', 'item', 'equal', 'is_nonzero'}


class Count(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.calls = self.reads = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls += 1
        self.reads += func.overloadpacket.__name__ in HOST_READS
        return func(*args, **(kwargs or {}))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--repeats', type=int, default=5)
    args = parser.parse_args()
    print(f'{platform.processor() or platform.machine()}, torch {torch.__version__}, '
          f'{torch.get_num_threads()} threads')
    print(f'{"grid":>9} {"method":>22} {"ms":>9} {"aten calls":>11} {"host reads":>11}')
    for height, width in ((50, 84), (200, 336)):
        tokens = torch.nn.functional.layer_norm(torch.randn(2, height * width, 96), (96, ))
        sizes = [(height, width), (height * 3 // 4, width * 2 // 3)]
        for label, options in (('reference (gram)', dict(method='gram')), ('batched, eigh', dict(solver='eigh')),
                               ('batched, newton_schulz', dict(solver='newton_schulz'))):
            conditioner = TokenConditioner(**options)
            conditioner(tokens, hw_shape=(height, width), valid_shapes=sizes)
            times = []
            for _ in range(args.repeats):
                start = time.perf_counter()
                conditioner(tokens, hw_shape=(height, width), valid_shapes=sizes)
                times.append(time.perf_counter() - start)
            with Count() as count:
                conditioner(tokens, hw_shape=(height, width), valid_shapes=sizes)
            print(f'{height:>4}x{width:<4} {label:>22} {1e3 * statistics.median(times):9.1f} {count.calls:11d} '
                  f'{count.reads:11d}')


if __name__ == '__main__':
    main()
