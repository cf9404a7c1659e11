"""The GPU benchmark's parts that run anywhere: condtok_mm.conditioning imported with nothing but torch
(tools/benchmark/bare_torch.py), and the rows of tools/benchmark/conditioner_cuda.py rehearsed on the CPU."""
import os.path as osp
import subprocess
import sys

import pytest
import torch
from helpers.repo import REPO_ROOT, load_script

from condtok_mm.conditioning import condition_tokens

BENCHMARKS = osp.join(REPO_ROOT, 'tools', 'benchmark')


def _run_without_mmengine(code: str) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter where mmengine cannot be imported (as on a machine with only torch)."""
    prelude = (f'import sys; sys.modules["mmengine"] = None; sys.path.insert(0, {BENCHMARKS!r}); '
               f'sys.path.insert(1, {REPO_ROOT!r}); ')
    return subprocess.run([sys.executable, '-c', prelude + code], capture_output=True, text=True, cwd=REPO_ROOT,
                          timeout=300)


@pytest.mark.slow
def test_conditioning_imports_on_its_own_where_mmengine_is_missing():
    code = ('import torch, bare_torch; c = bare_torch.import_conditioning(); '
            'x = torch.nn.functional.layer_norm(torch.randn(1, 60, 8, generator=torch.Generator().manual_seed(0)), '
            '(8, )); print(float(c.condition_number(c.condition_tokens(x))[0])); '
            'print(sorted(m for m in sys.modules if m.startswith("condtok_mm.") and not '
            'm.startswith("condtok_mm.conditioning")))')
    result = _run_without_mmengine(code)
    assert result.returncode == 0, result.stderr
    kappa, others = result.stdout.splitlines()
    assert 1.99 < float(kappa) <= 2 * (1 + 1e-4)
    assert others == '[]'  # the registration (models, datasets, ...) never ran
    # without the stand-in, the same import fails on mmengine
    failed = _run_without_mmengine('import condtok_mm.conditioning')
    assert failed.returncode != 0 and 'mmengine' in failed.stderr


def test_the_installed_package_is_used_where_mmengine_imports():
    bare_torch = load_script('benchmark', 'bare_torch.py')
    import condtok_mm
    assert not bare_torch.install()
    assert bare_torch.import_conditioning() is sys.modules['condtok_mm.conditioning']
    assert hasattr(condtok_mm, 'models')


def test_float32_svd_form_is_the_papers_correction_on_each_valid_region():
    conditioner_cuda = _conditioner_cuda()
    # full-rank regions: a null direction's singular vectors are LAPACK's choice, not a property of the form
    grid = torch.randn(2, 6, 10, 8, generator=torch.Generator().manual_seed(0))
    sizes = torch.tensor([[6, 10], [4, 6]])
    out = conditioner_cuda.float32_svd_form(grid, sizes.tolist())
    for b, (h, w) in enumerate(sizes.tolist()):
        region = grid[b, :h, :w].reshape(1, h * w, -1)
        want = condition_tokens(region.double(), method='svd')
        torch.testing.assert_close(out[b, :h, :w].reshape(1, h * w, -1).double(), want, rtol=1e-5, atol=1e-5)
    assert torch.equal(out[1, 4:], grid[1, 4:]) and torch.equal(out[1, :, 6:], grid[1, :, 6:])


def test_cuda_rows_rehearsed_on_the_cpu_hold_the_bound_and_the_gap():
    conditioner_cuda = _conditioner_cuda()
    rows = conditioner_cuda.measure_grid(12, 20, 16, 2, repeats=2, executions=('eager', ), device='cpu')
    assert {row['method'] for row in rows} == set(conditioner_cuda.METHODS)
    for row in rows:
        assert 'error' not in row, row
        assert row['ms_per_image'] > 0 and len(row['times_ms']) == 2 and row['aten_ops'] > 0
        if row['method'] in conditioner_cuda.BOUNDED:
            assert 1.5 < row['kappa_max'] <= 2 * (1 + 1e-4), row
    newton_schulz = next(row for row in rows if row['method'] == 'batched, newton_schulz')
    assert 0 < newton_schulz['gap_to_eigh'] <= 1e-4


def _conditioner_cuda():
    sys.path.insert(0, BENCHMARKS)  # its sibling imports (bare_torch, op_counts)
    try:
        return load_script('benchmark', 'conditioner_cuda.py')
    finally:
        sys.path.remove(BENCHMARKS)
