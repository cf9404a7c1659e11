"""The two-pass path (whole images of float32/16 tokens, conditioning/two_pass.py): the one-program path's X + C
and status without a float64 copy of X, over any number of chunks, and taken exactly where it applies."""
from unittest import mock

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from condtok_mm.conditioning import (ConditioningOptions, condition_number, condition_token_windows,
                                     condition_valid_regions)
from condtok_mm.conditioning import grids, two_pass
from condtok_mm.conditioning.batched import condition_masked, finish
from condtok_mm.conditioning.diagnostics import BAD_INPUT, FINE
from condtok_mm.models.token_conditioner import TokenConditioner
from condtok_mm.benchmark import op_counts


def layer_normed(batch, length, channels, seed=0, dtype=torch.float32):
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randn(batch, length, channels, generator=generator, dtype=torch.float64)
    return torch.nn.functional.layer_norm(tokens, (channels, )).to(dtype)


@pytest.fixture
def seven_row_chunks(monkeypatch):
    """Chunks of 7 rows at 16 channels: band edges and valid-region edges fall inside chunks and between them."""
    monkeypatch.setitem(two_pass.CHUNK_ELEMENTS, 'cpu', 7 * 16)


@pytest.mark.parametrize('mode, solver, alpha', [('sigma_max', 'eigh', 1.0), ('floor', 'eigh', 1.0),
                                                 ('sigma_max', 'newton_schulz', 0.5)])
def test_equals_the_one_program_path_over_many_chunks(seven_row_chunks, mode, solver, alpha):
    x = layer_normed(4, 200, 16)
    valid = torch.tensor([200, 131, 5, 0])  # all, most, fewer than d, none
    mask = torch.arange(200) < valid[:, None]
    mask[1, 40:60] = False  # a gap inside the valid tokens
    options = ConditioningOptions(mode=mode, alpha=alpha, solver=solver)
    out, status = two_pass.condition_two_pass(x, mask, options)
    conditioned, expected_status = condition_masked(x, mask, options)
    torch.testing.assert_close(out, finish(x, conditioned, mask), rtol=2e-6, atol=1e-6)
    assert torch.equal(out[~mask], x[~mask])
    assert torch.equal(status, expected_status) and status.tolist() == [FINE] * 4


@pytest.mark.parametrize('rows', [1, 63, 64, 65, 150, 64 * 64 + 3, 3 * 64**3 // 8])
def test_running_sums_are_the_cumsum_exactly_on_integers(rows):
    # integer-valued float64 sums are exact in any order, so the blocked scan must equal cumsum bit for bit
    x = torch.randint(-1000, 1000, (2, rows, 3), generator=torch.Generator().manual_seed(rows)).double()
    assert torch.equal(two_pass.running_sums(x, 64), x.cumsum(1))


class _ScanLengths(TorchDispatchMode):
    """The length of every cumsum along a dim other than the last (the ones CUDA runs as a sequential loop)."""

    def __init__(self):
        super().__init__()
        self.lengths = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket is torch.ops.aten.cumsum and args[1] % args[0].dim() != args[0].dim() - 1:
            self.lengths.append(args[0].shape[args[1]])
        return func(*args, **(kwargs or {}))


def test_chunks_longer_than_a_scan_block_are_scanned_in_blocks_with_the_same_result(monkeypatch):
    monkeypatch.setitem(two_pass.CHUNK_ELEMENTS, 'cpu', 150 * 16)  # chunks of 150 and 50 rows
    monkeypatch.setitem(two_pass.SCAN_BLOCK, 'cpu', 64)  # CUDA's blocks
    x = layer_normed(2, 200, 16)
    mask = torch.arange(200) < torch.tensor([[200], [131]])
    with _ScanLengths() as scans:
        out, _ = two_pass.condition_two_pass(x, mask, ConditioningOptions(solver='newton_schulz'))
    assert scans.lengths and max(scans.lengths) <= 64, scans.lengths
    conditioned, _ = condition_masked(x, mask, ConditioningOptions(solver='newton_schulz'))
    torch.testing.assert_close(out, finish(x, conditioned, mask), rtol=2e-6, atol=1e-6)


def test_alpha_zero_gives_the_tokens_exactly(seven_row_chunks):
    x = layer_normed(2, 200, 16)
    mask = torch.arange(200) < torch.tensor([[200], [77]])
    out, _ = two_pass.condition_two_pass(x, mask, ConditioningOptions(alpha=0.0, solver='eigh'))
    assert torch.equal(out, x)


@pytest.mark.parametrize('mode', ['sigma_max', 'floor'])
def test_kappa_bound_holds_on_each_valid_region(seven_row_chunks, mode):
    grid = layer_normed(3, 12 * 20, 16).view(3, 12, 20, 16)
    sizes = [(12, 20), (9, 13), (6, 17)]
    with mock.patch.object(grids, 'condition_two_pass', wraps=two_pass.condition_two_pass) as spy:
        out = condition_valid_regions(grid, sizes, mode=mode)
    assert spy.call_count == 1
    for image, (h, w) in enumerate(sizes):
        region = out[image, :h, :w].reshape(-1, 16)
        assert condition_number(region.double()) <= 2 * (1 + 1e-4)
        assert torch.equal(out[image, h:], grid[image, h:]) and torch.equal(out[image, :, w:], grid[image, :, w:])


def test_non_finite_tokens_raise_and_padding_holds_anything(seven_row_chunks):
    grid = layer_normed(2, 12 * 20, 16).view(2, 12, 20, 16)
    sizes = [(12, 20), (6, 10)]
    clean = condition_valid_regions(grid, sizes)
    padded = grid.clone()
    padded[1, 8:, 12:] = float('nan')
    assert torch.equal(condition_valid_regions(padded, sizes)[1, :6, :10], clean[1, :6, :10])
    broken = grid.clone()
    broken[1, 2, 3, 4] = float('inf')
    _, status = two_pass.condition_two_pass(broken.view(2, -1, 16), torch.ones(2, 240, dtype=torch.bool),
                                            ConditioningOptions(solver='eigh'))
    assert status.tolist() == [FINE, BAD_INPUT]
    with pytest.raises(ValueError, match='non-finite'):
        condition_valid_regions(broken, sizes)


def test_float16_overflow_names_half_precision(seven_row_chunks):
    grid = (layer_normed(1, 12 * 20, 16) * 600).to(torch.float16).view(1, 12, 20, 16)
    with pytest.raises(ValueError, match='float16 \\(half precision\\) holds values up to 65504'):
        condition_valid_regions(grid, [(12, 20)], alpha=100.0)


@pytest.mark.parametrize('case, taken', [
    (dict(), True),
    (dict(dtype=torch.float16), True),
    (dict(dtype=torch.float64), False),       # float64 tokens: scaled on the one-program path
    (dict(window_size=4), False),             # windows are short stacks
    (dict(centred=True), False),
    (dict(mode='graying'), False),
    (dict(grid=(3, 16)), False),              # 48 tokens <= 4 x 16: singular values from u~ V
])
def test_taken_for_tall_whole_images_of_narrow_tokens_only(case, taken):
    height, width = case.get('grid', (12, 20))
    grid = layer_normed(2, height * width, 16, dtype=case.get('dtype', torch.float32)).view(2, height, width, 16)
    options = {k: v for k, v in case.items() if k in ('centred', 'mode')}
    with mock.patch.object(grids, 'condition_two_pass', wraps=two_pass.condition_two_pass) as spy:
        if 'window_size' in case:
            condition_token_windows(grid.view(2, -1, 16), (height, width), case['window_size'])
        else:
            condition_valid_regions(grid, [(height, width), (height - 1, width - 2)], **options)
    assert spy.called == taken


@pytest.mark.parametrize('solver', ['eigh', 'newton_schulz'])
def test_over_several_chunks_the_op_count_is_flat_in_the_batch_and_the_gpu_path_reads_nothing_back(
        seven_row_chunks, solver):
    conditioner = TokenConditioner(solver=solver, check=False)
    counts = []
    for batch in (2, 6):
        grid = layer_normed(batch, 12 * 20, 16).view(batch, 12, 20, 16)
        sizes = torch.tensor([[12 - b % 4, 20 - 3 * (b % 5)] for b in range(batch)])
        with mock.patch.object(grids, 'condition_two_pass', wraps=two_pass.condition_two_pass) as spy:
            counts.append(op_counts.count_ops(lambda: conditioner(grid.view(batch, -1, 16), (12, 20), sizes)))
        assert spy.call_count == 1
    assert counts[0]['aten_ops'] == counts[1]['aten_ops']
    if solver == 'newton_schulz':  # the CUDA default, without the CPU's immediate status read: no host read
        assert counts[0]['host_reads'] == counts[1]['host_reads'] == 0


@pytest.mark.slow
def test_over_several_chunks_it_compiles_whole(seven_row_chunks):
    import torch._dynamo
    torch._dynamo.reset()
    conditioner = TokenConditioner(check=False)
    grid = layer_normed(2, 12 * 20, 16)
    sizes = torch.tensor([[12, 20], [7, 9]])
    explanation = torch._dynamo.explain(conditioner)(grid, hw_shape=(12, 20), valid_shapes=sizes)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1, explanation.break_reasons
    torch._dynamo.reset()
