"""The byte counter and the peak-memory counter of tools/benchmark/byte_counts.py: exact counts of single ops, and the
conditioner's passes over its tokens and its peak extra memory held where they are (a full copy of the tokens put
back turns the tests red)."""
import json
import os
import os.path as osp
import subprocess
import sys

import pytest
import torch

from condtok_mm.benchmark import byte_counts
from helpers.repo import REPO_ROOT


X = torch.randn(64, 32)  # float32: one pass is 64 * 32 * 4 bytes


@pytest.mark.parametrize('fn, passes', [
    (lambda x: x.clone(), 2),                           # read 1, write 1
    (lambda x: x.double(), 3),                          # read 4 bytes, write 8 per element
    (lambda x: x.double().float(), 6),
    (lambda x: x.view(32, 64).t().expand(2, 64, 32), 0),  # views move nothing
    (lambda x: x.reshape(2, 32, 32), 0),
    (lambda x: x.t().reshape(-1), 2),                   # a copy (then an unmarked view of it)
    (lambda x: x.clone().add_(x), 2 + 3),               # in place: reads both, writes one
    (lambda x: torch.empty_like(x).copy_(x), 2),        # copy_ does not read what it overwrites
    (lambda x: x + 1, 2),
    (lambda x: torch.zeros_like(x).add_(x), 1 + 3),     # zeros_like writes, reads nothing
    (lambda x: torch.where(x > 0, x, 0.0), 1.25 + 2.25),  # gt writes a bool mask (a quarter pass), where reads it
    (lambda x: x.T @ x[:, :16], 1.5),                   # reads x and half of it; the 32 x 16 result is too small
    (lambda x: x.sum(0), 1),                            # the 32-element result is below the size
    (lambda x: x.index_select(0, torch.arange(0, 64, 4)), 0),     # a quarter of x: below the size
    (lambda x: x.index_select(0, torch.arange(64).repeat(2)), 2 + 2),  # reads the 128 rows it returns, writes them
    (lambda x: [x[i:i + 8].double() for i in range(0, 64, 8)], 1),  # chunks read through views; copies chunk-sized
], ids=['clone', 'double', 'round-trip', 'views', 'reshape-view', 'reshape-copy', 'add_', 'copy_', 'add',
        'zeros_like', 'where', 'gram', 'sum', 'gather-small', 'gather', 'chunks'])
def test_single_ops_move_what_they_read_and_write(fn, passes):
    assert byte_counts.count_bytes(lambda: fn(X), X.numel())['passes'] == passes


# The conditioner's passes over its tokens, at grids of several chunks (tall enough that a chunk's float64 copy is
# below half the tokens' size, as at Swin-T's and ViTDet-B's first stage): one read of X for the Gram matrix and the
# band sums, one read and one write for X + C. The goal is 4; a full copy of the tokens put back costs at least 2.
CHUNKED_GRIDS = [(256, 384, 16), (96, 192, 64)]
PASSES_GOAL = 4


@pytest.mark.parametrize('solver', ['eigh', 'newton_schulz'])
@pytest.mark.parametrize('grid', CHUNKED_GRIDS, ids=['256x384x16', '96x192x64'])
def test_the_conditioner_reads_its_tokens_twice_and_writes_them_once(grid, solver):
    counts = byte_counts.conditioner_passes(*grid, solver)
    assert counts['passes'] <= PASSES_GOAL, counts['passes_by_op']
    assert counts['passes_by_op'] == {'_to_copy': 2.0, 'copy_': 1.0}


@pytest.mark.parametrize('fn, peak', [
    (lambda x: x.clone(), 1),
    (lambda x: x.double(), 2),
    (lambda x: (x.double() + 1).float(), 4),  # the float64 copy and its sum live together, then the cast
    (lambda x: x.view(-1), 0),  # a view allocates nothing
    (lambda x: x.clone().add_(1), 1),  # in place: no new storage
    (lambda x: [x.clone() for _ in range(3)], 3),
    (lambda x: [x.clone().sum() for _ in range(3)], 1 + 3 * 4 / X.nbytes),  # each clone freed, its sum kept
], ids=['clone', 'double', 'chain', 'view', 'in-place', 'kept', 'freed'])
def test_peak_extra_memory_of_single_ops(fn, peak):
    assert byte_counts.peak_extra_bytes(lambda: fn(X)) / X.nbytes == pytest.approx(peak)


# Today's peak extra memory of the conditioner, in units of X in float32: the result (1), a chunk's float64
# temporaries and a few d x d float64 matrices per image, which at these small grids weigh 1.1-1.2 X (the goal: 1
# plus O(d^2) per image). A full copy of the tokens put back adds at least 1.
PEAK_TODAY = {(256, 384, 16): 2.2, (96, 192, 64): 2.3}


@pytest.mark.parametrize('grid', CHUNKED_GRIDS, ids=['256x384x16', '96x192x64'])
def test_the_conditioner_holds_no_more_memory_than_today(grid):
    assert byte_counts.conditioner_passes(*grid, 'eigh')['peak_extra'] <= PEAK_TODAY[grid]


@pytest.mark.slow
def test_conditioner_cost_reports_every_method_beside_the_floor(tmp_path):
    result = subprocess.run(
        [sys.executable, osp.join(REPO_ROOT, 'tools', 'benchmark', 'conditioner_cost.py'), '--grids', '12x20x16',
         '--repeats', '2', '--profile', '--out-dir', str(tmp_path)],
        capture_output=True, text=True, timeout=300, cwd=REPO_ROOT, env=dict(os.environ, OMP_NUM_THREADS='1'))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.load(open(tmp_path / 'conditioner_cost.json'))
    assert [row['method'] for row in report['rows']] == ['float64 floor', 'reference (gram)', 'batched, eigh',
                                                         'batched, newton_schulz', 'graying, SVD form',
                                                         'graying, DCT form']
    floor = report['rows'][0]
    # cast 3, the Gram product reads X twice 4, X times it 4, the cast back 3
    assert floor['floor_ratio'] == 1 and floor['passes'] == 3 + 4 + 4 + 3
    for row in report['rows']:
        assert row['grid'] == [12, 20] and row['channels'] == 16 and len(row['times_ms']) == 2
        assert row['ms'] == min(row['times_ms']) and row['floor_ratio'] == pytest.approx(row['ms'] / floor['ms'])
    batched = report['rows'][2]
    assert batched['passes'] == byte_counts.conditioner_passes(12, 20, 16, 'eigh')['passes']
    # the gap of Newton-Schulz to eigh, and only where the two compute the same map
    assert [row['gap_to_eigh'] is None for row in report['rows']] == [True, True, True, False, True, True]
    assert 0 < report['rows'][3]['gap_to_eigh'] <= 1e-4
    # --profile: each batched solver's costliest ops, eigh's own among them
    assert [row['profile'] is None for row in report['rows']] == [True, True, False, False, True, True]
    assert 'aten::_linalg_eigh' in {event['op'] for event in report['rows'][2]['profile']}
    assert all(event['ms'] >= 0 and event['calls'] >= 1 for event in report['rows'][3]['profile'])
    assert (tmp_path / 'conditioner_cost.png').stat().st_size > 0
    assert '12x20x16          batched, eigh' in result.stdout
