"""The centred variant's coordinates: tokens in an orthonormal basis Q of the complement of the all-ones channel
vector (what a following LayerNorm lets through), from one Householder reflection (O(N d) each way)."""
import math
from typing import Tuple

import torch


def _householder_to_ones(d: int, dtype: torch.dtype, device: torch.device) -> Tuple[torch.Tensor, float]:
    """(w, c) of the reflection H = I - c w w^T that maps 1/sqrt(d) to e_1 (H is symmetric, H H = I)."""
    w = torch.full((d, ), 1 / math.sqrt(d), dtype=dtype, device=device)
    w[0] -= 1
    return w, 1 / (1 - 1 / math.sqrt(d))  # 2 / (w^T w), w^T w = 2 - 2 / sqrt(d): no host read of w @ w


def channel_mean_complement(x: torch.Tensor) -> torch.Tensor:
    """X Q for tokens X (..., N, d): each token in an orthonormal basis Q of the complement of the all-ones
    channel vector (shape (..., N, d - 1)). Singular values of X Q are those of X with the channel mean of
    every token removed, i.e. what a following LayerNorm can see. Needs d >= 2."""
    w, c = _householder_to_ones(x.shape[-1], x.dtype, x.device)
    return (x - c * (x @ w).unsqueeze(-1) * w)[..., 1:]


def _from_channel_mean_complement(y: torch.Tensor) -> torch.Tensor:
    """Y Q^T for Y (..., N, d - 1): back to channel coordinates, with no component along the ones vector."""
    z = torch.nn.functional.pad(y, (1, 0))
    w, c = _householder_to_ones(z.shape[-1], z.dtype, z.device)
    return z - c * (z @ w).unsqueeze(-1) * w

