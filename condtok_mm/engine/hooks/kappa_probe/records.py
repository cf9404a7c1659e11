"""The kappa values a probe records while it is active, and their mean and max across ranks."""
import math
from collections import defaultdict
from typing import Dict, List

import torch
from mmengine.dist import all_gather_object, all_reduce, get_world_size

from condtok_mm.conditioning import condition_number

# A float64 SVD cannot resolve a smallest singular value below ~1e-16 s_max: larger kappa means
# "numerically singular", and capping keeps means and plots finite.
KAPPA_CAP = 1e16
# 1 / u, u = eps / 2 the unit roundoff of float32, in which the models compute: a float32 matrix with larger kappa
# cannot be told from a singular one, so such a value is set by rounding, not by the matrix ("numerically singular").
SINGULAR_KAPPA = 2.0 / torch.finfo(torch.float32).eps


def kappa(matrices: torch.Tensor) -> torch.Tensor:
    """kappa of each matrix of a (M, rows, cols) batch, float64, capped at KAPPA_CAP."""
    return condition_number(matrices).clamp(max=KAPPA_CAP)


def evenly(count: int, limit: int) -> torch.Tensor:
    """At most ``limit`` indices spread evenly over range(count)."""
    if count <= limit:
        return torch.arange(count)
    return torch.linspace(0, count - 1, limit).round().long()


class KappaRecords:
    """Values recorded under keys ``<family>/<quantity>/<stage or layer>`` while :attr:`active`.

    The probe's recorders add to it from their forward hooks (which do nothing while it is not active);
    :meth:`reduce` turns everything added into ``<family>/<quantity>_{mean,max}/<where>`` scalars.
    """

    def __init__(self):
        self.active = False
        self.values: Dict[str, List[torch.Tensor]] = defaultdict(list)

    def add(self, key: str, values: torch.Tensor) -> None:
        self.values[key].append(values.detach().reshape(-1).double().cpu())

    def reduce(self) -> Dict[str, float]:
        """Mean and max of every recorded quantity over what was captured, across ranks; then reset.

        Ranks may record different quantities (e.g. one rank's global attention exceeds
        max_attention_tokens, another's does not): the reduction runs over the union of their keys.
        """
        keys = sorted(self.values)
        if get_world_size() > 1:
            keys = sorted(set().union(*all_gather_object(keys)))
        scalars = {}
        if keys:
            empty = torch.tensor([0., 0., -math.inf], dtype=torch.float64)
            stats = torch.stack([
                torch.stack([torch.cat(self.values[k]).sum(),
                             torch.tensor(float(sum(v.numel() for v in self.values[k])), dtype=torch.float64),
                             torch.cat(self.values[k]).max()]) if k in self.values else empty for k in keys])
            if get_world_size() > 1:
                sums = stats[:, :2].clone()
                maxima = stats[:, 2].clone()
                all_reduce(sums, op='sum')
                all_reduce(maxima, op='max')
                stats = torch.cat([sums, maxima[:, None]], dim=1)
            for key, (total, count, maximum) in zip(keys, stats.tolist()):
                if count == 0:
                    continue
                family, quantity, where = key.split('/')
                scalars[f'{family}/{quantity}_mean/{where}'] = total / count
                scalars[f'{family}/{quantity}_max/{where}'] = maximum
        self.values.clear()
        return scalars
