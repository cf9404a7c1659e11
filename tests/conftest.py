import math
import os.path as osp
import socket

import pytest
import torch

REPO_ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))


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


@pytest.fixture(scope='session')
def shapes_root(tmp_path_factory):
    """A small shapes dataset written once per test session."""
    from condtok_mm.datasets import make_shapes_dataset
    root = tmp_path_factory.mktemp('shapes')
    make_shapes_dataset(str(root), num_train=16, num_val=8, image_size=(96, 96), seed=3)
    return str(root)


def free_port():
    """A TCP port on 127.0.0.1 that no one listens on now (the OS picks it), so that parallel runs differ."""
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]
