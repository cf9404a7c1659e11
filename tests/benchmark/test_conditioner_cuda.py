"""The GPU benchmark's parts that run anywhere: condtok_mm.conditioning and condtok_mm.benchmark.conditioner_cuda
imported with nothing but torch (no OpenMMLab stack: nothing is registered), the package registering its modules
where mmengine is installed, and the rows of conditioner_cuda rehearsed on the CPU."""
import subprocess
import sys

import pytest
import torch

import condtok_mm
from condtok_mm.benchmark import conditioner_cuda
from condtok_mm.conditioning import condition_tokens
from condtok_mm.registry import METRICS
from helpers.repo import REPO_ROOT


@pytest.mark.slow
def test_the_conditioning_and_the_cuda_benchmark_import_where_mmengine_is_not_installed():
    # a fresh interpreter where mmengine is not installed (None in sys.modules is what the import system and
    # importlib.util.find_spec read as 'not found'), as on a GPU machine with only torch
    code = ('import sys; sys.modules["mmengine"] = None; import torch; '
            'from condtok_mm import conditioning as c; from condtok_mm.benchmark import conditioner_cuda; '
            'x = torch.nn.functional.layer_norm(torch.randn(1, 60, 8, generator=torch.Generator().manual_seed(0)), '
            '(8, )); print(float(c.condition_number(c.condition_tokens(x))[0])); '
            'print(sorted(m for m in sys.modules if m.startswith("condtok_mm.") and not '
            'm.startswith(("condtok_mm.conditioning", "condtok_mm.benchmark", "condtok_mm.version"))))')
    result = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, cwd=REPO_ROOT, timeout=300)
    assert result.returncode == 0, result.stderr
    kappa, others = result.stdout.splitlines()
    assert 1.99 < float(kappa) <= 2 * (1 + 1e-4)
    assert others == '[]'  # the registration (models, datasets, ...) never ran


def test_importing_the_package_registers_its_modules_where_mmengine_is_installed():
    assert hasattr(condtok_mm, 'models') and hasattr(condtok_mm, 'datasets')
    assert METRICS.get('FastCocoMetric') is condtok_mm.evaluation.FastCocoMetric


def test_float32_svd_form_is_the_papers_correction_on_each_valid_region():
    # full-rank regions: a null direction's singular vectors are LAPACK's choice, not a property of the form
    grid = torch.randn(2, 6, 10, 8, generator=torch.Generator().manual_seed(0))
    sizes = torch.tensor([[6, 10], [4, 6]])
    out = conditioner_cuda.float32_svd_form(grid, sizes.tolist())
    for b, (h, w) in enumerate(sizes.tolist()):
        region = grid[b, :h, :w].reshape(1, h * w, -1)
        want = condition_tokens(region.double(), solver='reference_svd')
        torch.testing.assert_close(out[b, :h, :w].reshape(1, h * w, -1).double(), want, rtol=1e-5, atol=1e-5)
    assert torch.equal(out[1, 4:], grid[1, 4:]) and torch.equal(out[1, :, 6:], grid[1, :, 6:])


def test_cuda_rows_rehearsed_on_the_cpu_hold_the_bound_and_the_gap():
    rows = conditioner_cuda.measure_grid(12, 20, 16, 2, repeats=2, executions=('eager', ), device='cpu')
    assert {row['method'] for row in rows} == set(conditioner_cuda.METHODS)
    for row in rows:
        assert 'error' not in row, row
        assert row['ms_per_image'] > 0 and len(row['times_ms']) == 2 and row['aten_ops'] > 0
        if row['method'] in conditioner_cuda.BOUNDED:
            assert 1.5 < row['kappa_max'] <= 2 * (1 + 1e-4), row
    newton_schulz = next(row for row in rows if row['method'] == 'batched, newton_schulz')
    assert 0 < newton_schulz['gap_to_eigh'] <= 1e-4
