import json
import os.path as osp
import statistics
import subprocess
import sys

import pytest
import torch
from mmengine.config import Config
from mmengine.registry import init_default_scope

import condtok_mm  # noqa: F401
from condtok_mm.benchmark import op_counts
from condtok_mm.registry import MODELS
from helpers.repo import REPO_ROOT


@pytest.mark.slow
def test_overhead_benchmark_times_the_twins_and_the_methods_and_checks_the_conditioner(tmp_path):
    """A small Swin-T Mask R-CNN pair and the comparison methods, in one run: medians of both phases, peak
    memory of both, the conditioner against its floor and the plain SVD on the tokens the model's
    conditioner received (kappa <= 2 after both, launches, syncs and float64 FLOPs counted), and spectral
    conditioning and Token Graying in the same interleaved rounds."""
    result = subprocess.run(
        [sys.executable, osp.join(REPO_ROOT, 'tools', 'benchmark', 'overhead.py'), '--models', 'swin-t',
         '--methods', 'spectral', 'graying', '--size', '60', '90', '--repeats', '1', '--conditioner-repeats', '1',
         '--device', 'cpu', '--out-dir', str(tmp_path)], capture_output=True, text=True, timeout=900, cwd=REPO_ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.load(open(tmp_path / 'overhead.json'))
    swin = summary['results']['swin-t']
    assert swin['size'] == [60, 90] and swin['step_goal_percent'] == 1.0
    for phase in ('train', 'inference'):
        times = swin['times'][phase]
        assert all(len(times[variant]) == 1 for variant in ('baseline', 'conditioned', 'spectral', 'graying'))
        base, cond = statistics.median(times['baseline']), statistics.median(times['conditioned'])
        assert (swin[phase]['baseline_s'], swin[phase]['conditioned_s']) == (base, cond)
        assert swin[phase]['overhead_percent'] == pytest.approx(100 * (cond / base - 1))
    process = swin['memory']['peaks']['process']
    assert swin['memory']['kind'] == 'peak RSS of the process'
    # At its peak each process holds the weights, their gradients and AdamW's two moments: 16 bytes a parameter
    cfg = Config.fromfile(osp.join(REPO_ROOT, swin['conditioned_config']))
    init_default_scope('mmdet')
    parameters = sum(p.numel() for p in MODELS.build(cfg.model).parameters())
    assert process['baseline_bytes'] > 16 * parameters and process['conditioned_bytes'] > 16 * parameters
    assert process['overhead_percent'] == pytest.approx(
        100 * (process['conditioned_bytes'] / process['baseline_bytes'] - 1))

    conditioner = swin['conditioner']
    # stride-4 patch embedding of 60 x 90 padded to 64 x 96: the conditioner sees 15 x 23 valid tokens
    assert conditioner['tokens_shape'] == [1, 16 * 24, 96] and conditioner['valid_shapes'] == [[15, 23]]
    floor = conditioner['floor (two float64 products)']
    assert conditioner['conditioner']['times_floor'] == conditioner['conditioner']['seconds'] / floor['seconds']
    assert 'x the floor (goal <= 1.5x' in result.stdout
    for phase, key in (('train', 'percent_of_baseline_train_step'), ('inference', 'percent_of_baseline_inference')):
        assert conditioner[key] == pytest.approx(
            100 * conditioner["conditioner"]["seconds"] / swin[phase]["baseline_s"])
    for implementation in ('conditioner', 'torch.linalg.svd'):
        assert conditioner[implementation]['kappa_before_max'] > 10
        assert conditioner[implementation]['kappa_after_max'] == pytest.approx(2.0, abs=1e-3)
    # the counts: on the CPU launches are the aten ops and syncs the host reads, integers for every implementation
    assert conditioner['counted'] == dict(launches='aten ops dispatched (TorchDispatchMode)',
                                          syncs='host reads: ops that make a GPU wait for a value (TorchDispatchMode)')
    for implementation in ('conditioner', 'floor (two float64 products)', 'torch.linalg.svd'):
        measured = conditioner[implementation]
        assert (measured['launches_per_batch'], measured['syncs_per_batch']) == (
            measured['counts']['aten_ops'], measured['counts']['host_reads'])
        for key in ('launches_per_batch', 'syncs_per_batch', 'float64_flops_per_image'):
            assert isinstance(measured[key], int) and measured[key] >= 0
    # the floor is exactly its two products per image of the 345 x 96 valid tokens: X^T X and X times d x d,
    # 2 N d^2 flops each, four ops (transpose, mm, slice, mm), no host read; the plain SVD runs in float32
    # (no float64 flop) and reads back its error check
    assert (floor['float64_flops_per_image'], floor['launches_per_batch'], floor['syncs_per_batch']) == (
        4 * 345 * 96**2, 4, 0)
    assert conditioner['torch.linalg.svd']['float64_flops_per_image'] == 0
    assert conditioner['torch.linalg.svd']['syncs_per_batch'] >= 1
    assert 'launches/batch' in result.stdout and 'float64 GFLOP/image' in result.stdout
    markdown = (tmp_path / 'overhead.md').read_text()
    assert '| swin-t | train |' in markdown and '| launches/batch | syncs/batch | float64 GFLOP/image |' in markdown
    assert f'| {conditioner["conditioner"]["launches_per_batch"]} | {conditioner["conditioner"]["syncs_per_batch"]} |' \
        in markdown
    assert (tmp_path / 'overhead.png').read_bytes()[:4] == b'\x89PNG'
    assert 'swin-t    train' in result.stdout and 'machine:' in result.stdout
    assert 'paramwise_options' not in result.stdout + result.stderr

    # --methods: spectral conditioning and Token Graying timed in the same interleaved rounds as the twins
    assert list(swin['methods']) == ['conditioned', 'spectral', 'graying']
    for method, measured in swin['methods'].items():
        assert measured['train']['config'] == f'configs/swin/mask-rcnn_swin-t-p4-w7-{method}_fpn_1x_coco.py'.replace(
            '-conditioned_', '-condtok_')
        for phase in ('train', 'inference'):
            seconds = statistics.median(swin['times'][phase][method])
            assert measured[phase]['seconds'] == seconds
            assert measured[phase]['overhead_percent'] == pytest.approx(
                100 * (seconds / swin[phase]['baseline_s'] - 1))
        assert measured['memory']['process']['overhead_percent'] == pytest.approx(
            100 * (measured['memory']['process']['bytes'] / process['baseline_bytes'] - 1))
    # graying has a conditioner of its own, timed alone; spectral has none (nothing to time: no extra pass)
    assert swin['methods']['graying']['conditioner']['seconds'] > 0
    assert 'conditioner' not in swin['methods']['spectral']
    assert 'swin-t    spectral' in result.stdout and 'swin-t    graying' in result.stdout


def test_op_counts_counts_each_dispatched_op_host_read_and_float64_flop():
    x = torch.randn(6, 4, dtype=torch.float64)

    def toy():
        for _ in range(3):
            x + 1                       # 3 add: 24 flops each
        gram = x.T @ x                  # permute, mm: 2 * 4 * 6 * 4 flops
        total = gram.sum()              # sum: 16
        total.item()                    # _local_scalar_dense: a read
        x[x > 0]                        # gt (24) and index with a boolean mask: a read
        torch.linalg.eigh(gram)         # _linalg_eigh (checks its CUDA info on the host): 9 * 4^3
        torch.linalg.cholesky_ex(gram)  # no check: 4^3 / 3
        torch.linalg.cholesky(gram)     # cholesky_ex, then _linalg_check_errors: a read
        x.float() @ x.float().T         # _to_copy twice, permute, mm in float32: no float64 flops

    counts = op_counts.count_ops(toy, 'cpu')
    assert counts == dict(aten_ops=3 + 2 + 1 + 1 + 2 + 1 + 1 + 2 + 4, host_reads=4,
                          float64_flops=int(3 * 24 + 192 + 16 + 24 + 9 * 4**3 + 2 * 4**3 / 3))


@pytest.mark.parametrize('fn, expected', [
    # thin SVD with vectors of 6 x 4: min(14 m n^2 + 8 n^3, 6 m n^2 + 20 n^3); one host read (its info check)
    (lambda x: torch.linalg.svd(x, full_matrices=False), dict(aten_ops=1, host_reads=1, float64_flops=1856)),
    # the float32 twin: the same ops, no float64 flops
    (lambda x: torch.linalg.svd(x.float(), full_matrices=False), dict(aten_ops=2, host_reads=1, float64_flops=0)),
    (lambda x: torch.nonzero(x), dict(aten_ops=1, host_reads=1, float64_flops=0)),
    (lambda x: torch.where(x > 0, x, 0.0), dict(aten_ops=3, host_reads=0, float64_flops=48)),
    (lambda x: torch.linalg.solve_triangular(x[:4], x.T, upper=True), dict(aten_ops=3, host_reads=0,
                                                                            float64_flops=16 * 6)),
], ids=['svd', 'svd-float32', 'nonzero', 'where', 'solve-triangular'])
def test_op_counts_of_single_ops(fn, expected):
    x = torch.randn(6, 4, dtype=torch.float64)
    assert op_counts.count_ops(lambda: fn(x), 'cpu') == expected


@pytest.mark.gpu
def test_op_counts_on_cuda_count_the_kernels_run_and_the_blocking_calls():
    x = torch.randn(64, 64, device='cuda')
    x + 1  # warm-up: the first launch loads the kernel

    def adds():
        for _ in range(3):
            x + 1  # one elementwise kernel each, nothing waits

    counts = op_counts.count_ops(adds, 'cuda')
    assert (counts['aten_ops'], counts['host_reads'], counts['cuda_kernels'], counts['cuda_syncs']) == (3, 0, 3, 0)
    # .item(): a sum kernel, then a copy to the host and one stream synchronize
    counts = op_counts.count_ops(lambda: x.sum().item(), 'cuda')
    assert (counts['host_reads'], counts['cuda_kernels'], counts['cuda_syncs']) == (1, 1, 1)
