"""FLOPs with the conditioner counted (condtok_mm.utils.flops, tools/analysis/get_flops.py)."""
import json
import os.path as osp
import subprocess
import sys

import pytest
import torch
from mmengine.analysis import FlopAnalyzer
from torch import nn

from condtok_mm.utils.flops import count_flops
from helpers.repo import REPO_ROOT


class Decompositions(nn.Module):

    def forward(self, symmetric, tall):
        return torch.linalg.eigh(symmetric)[1].sum() + torch.linalg.svd(tall, full_matrices=False)[0].sum()


def test_eigh_and_svd_are_counted_where_mmengine_counts_nothing():
    inputs = (torch.eye(10).expand(3, 10, 10).contiguous(), torch.randn(2, 50, 8))
    assert FlopAnalyzer(Decompositions(), inputs).total() == 0  # mmengine alone
    flops = count_flops(Decompositions(), inputs)
    eigh = 3 * 4.5 * 10**3  # 3 matrices of 10 x 10: 9 n^3 flops each (Golub and Van Loan), halved
    svd = 2 * min(14 * 50 * 8**2 + 8 * 8**3, 6 * 50 * 8**2 + 20 * 8**3) / 2  # 2 matrices of 50 x 8
    assert flops['decompositions'] == flops['total'] == eigh + svd


@pytest.mark.slow  # a fresh Python process (~10 s of imports on 2 cores)
def test_the_conditioned_twin_costs_its_conditioner_more_gram_product_and_eigh_included(tmp_path):
    configs = [osp.join(REPO_ROOT, 'configs', 'demo', name) for name in (
        'mask-rcnn_swin-mini_fpn_12e_shapes.py', 'mask-rcnn_swin-mini-condtok_fpn_12e_shapes.py')]
    out = tmp_path / 'flops.json'
    result = subprocess.run([sys.executable, osp.join(REPO_ROOT, 'tools', 'analysis', 'get_flops.py'), *configs,
                             '--shape', '128', '128', '--out', str(out)],
                            capture_output=True, text=True, timeout=600, cwd=REPO_ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    assert '| mask-rcnn_swin-mini-condtok_fpn_12e_shapes.py | 128x128 |' in result.stdout
    baseline, conditioned = json.loads(out.read_text())['results']
    assert baseline['conditioner'] == baseline['decompositions'] == 0
    assert conditioned['total'] - baseline['total'] == conditioned['conditioner']
    # the demo Swin's stage-0 tokens: N = 32 x 32 tokens of d = 32 channels; the Gram matrix X^T X and the
    # correction X M are N d^2 multiply-adds each, the d x d eigendecomposition 4.5 d^3
    tokens, channels = 32 * 32, 32
    assert conditioned['decompositions'] >= 4.5 * channels**3
    assert conditioned['conditioner'] >= 2 * tokens * channels**2 + conditioned['decompositions']
