"""Token matrices with known spectra, and the windows of a token grid, for the conditioning tests."""
import math

import pytest
import torch

# The first-stage token matrices of Swin-T (3136 x 96) and ViT-B (196 x 768): seconds each on 2 cores, so a test
# parametrized over them runs them in `make test` and its smaller shapes in `make test-quick`.
STAGE_SHAPES = [pytest.param((3136, 96), marks=pytest.mark.slow), pytest.param((196, 768), marks=pytest.mark.slow)]


def random_tokens(batch, n, d, kappa, dtype=torch.float32, seed=0):
    """(B, N, d) matrices with singular values log-spaced from 3 down to 3 / kappa."""
    gen = torch.Generator().manual_seed(seed)
    r = min(n, d)
    mats = []
    for _ in range(batch):
        u, _ = torch.linalg.qr(torch.randn(n, r, dtype=torch.float64, generator=gen))
        v, _ = torch.linalg.qr(torch.randn(d, r, dtype=torch.float64, generator=gen))
        s = 3 * torch.logspace(0, -math.log10(kappa), r, dtype=torch.float64)
        mats.append((u * s) @ v.T)
    return torch.stack(mats).to(dtype)


def window_matrices(grid, window_size):
    """{(top, left): (B, tokens, C)} of every window_size x window_size tile of a (B, H, W, C) token grid,
    from the top-left corner; tiles cut by the bottom/right border keep only their real tokens."""
    b, h, w, c = grid.shape
    return {(top, left): grid[:, top:top + window_size, left:left + window_size].reshape(b, -1, c)
            for top in range(0, h, window_size) for left in range(0, w, window_size)}
