"""The float64 reference path (solver='reference_gram' with its canonical null-space completion,
solver='reference_svd') is the test oracle of the batched path, so it must not move: its outputs on a fixed set of
inputs were recorded before the conditioning was split into a package (tests/conditioning/golden/reference_golden.npz,
on a CPU with AVX-512) and are compared to round-off (ROUND_OFF of each output's largest value: on an AVX2 CPU MKL
gives other last bits, 4e-8 relative in float32 outputs, 3e-15 in float64 ones). Tokens that are all equal are
interchangeable: which of them carries which lifted null direction is round-off's choice (the AVX2 CPU picks others),
so for them the Gram matrix (X + C)^T (X + C) and the singular values are compared. Regenerate only for an intended
change of the reference:
    PYTHONPATH=$PWD python tests/conditioning/test_reference_golden.py
"""
import os.path as osp

import numpy as np
import torch

from condtok_mm.conditioning import condition_token_windows, condition_tokens, condition_valid_regions

GOLDEN = osp.join(osp.dirname(osp.abspath(__file__)), 'golden', 'reference_golden.npz')


def _inputs():
    gen = torch.Generator().manual_seed(2026)

    def randn(*shape, dtype=torch.float32):
        return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype)

    layer_normed = torch.nn.functional.layer_norm(randn(2, 12, 10, 16), (16, ))
    rank_deficient = (randn(1, 300, 5) @ randn(1, 5, 16)).reshape(1, 20, 15, 16)
    return {
        'full_rank': randn(2, 200, 16),
        'layer_normed_grid': layer_normed,
        'rank_deficient_grid': rank_deficient,
        'few_rows_grid': torch.nn.functional.layer_norm(randn(1, 3, 40, 16), (16, )),
        'wide': randn(2, 5, 12),
        'constant': torch.ones(1, 30, 8),
        'float64': randn(2, 64, 8, dtype=torch.float64),
        'wide_spectrum': torch.nn.functional.layer_norm(
            randn(1, 400, 12) * torch.logspace(0, -5, 12, dtype=torch.float64).float(), (12, )),
    }


def _outputs():
    inputs = _inputs()
    out = {}
    for method in ('gram', 'svd'):
        for mode in ('sigma_max', 'floor', 'graying'):
            for name, x in inputs.items():
                if method == 'svd' and name in ('layer_normed_grid', 'rank_deficient_grid', 'few_rows_grid',
                                                'constant', 'wide_spectrum'):
                    continue  # the SVD's completion of null directions is LAPACK's choice, not a reference
                out[f'{method}/{mode}/{name}'] = condition_tokens(x, mode=mode, solver=f'reference_{method}')
        for name in ('full_rank', 'layer_normed_grid', 'rank_deficient_grid'):
            x = inputs[name]
            out[f'{method}/alpha/{name}'] = condition_tokens(x, alpha=0.3, target_kappa=5.0,
                                                               solver=f'reference_{method}')
    grid = inputs['layer_normed_grid']
    out['gram/centred'] = condition_tokens(grid, centred=True, solver='reference_gram')
    out['gram/valid_regions'] = condition_valid_regions(grid, [(7, 9), (12, 4)], solver='reference_gram')
    out['gram/valid_regions_window'] = condition_valid_regions(grid, [(7, 9), (12, 4)], window_size=4,
                                                               shift_size=2, solver='reference_gram')
    out['gram/windows'] = condition_token_windows(grid.reshape(2, 120, 16), (12, 10), 4, 1,
                                                  solver='reference_gram')
    x = inputs['full_rank'].double().requires_grad_(True)
    weight = torch.linspace(-1, 1, x.numel(), dtype=torch.float64).view_as(x)
    (condition_tokens(x, detach=False, solver='reference_gram') * weight).sum().backward()
    out['gram/gradient'] = x.grad
    return {key: value.detach().numpy() for key, value in out.items()}


ROUND_OFF = {np.dtype(np.float32): 1e-6, np.dtype(np.float64): 1e-12}
INTERCHANGEABLE_TOKENS = ('constant', )


def test_reference_path_is_the_recorded_one_to_round_off():
    want = np.load(GOLDEN, allow_pickle=False)
    got = _outputs()
    assert sorted(got) == sorted(want.files)
    for key, value in got.items():
        expected = want[key]
        assert value.dtype == expected.dtype and value.shape == expected.shape, key
        if key.split('/')[-1] in INTERCHANGEABLE_TOKENS:
            value, expected = value.astype(np.float64), expected.astype(np.float64)
            np.testing.assert_allclose(np.linalg.svd(value, compute_uv=False),
                                       np.linalg.svd(expected, compute_uv=False), rtol=1e-6, err_msg=key)
            value, expected = value.swapaxes(-1, -2) @ value, expected.swapaxes(-1, -2) @ expected
        tolerance = ROUND_OFF[np.dtype(want[key].dtype)] * np.abs(expected).max()
        np.testing.assert_allclose(value, expected, rtol=0, atol=tolerance, err_msg=key)


if __name__ == '__main__':
    np.savez_compressed(GOLDEN, **_outputs())
    print(f'wrote {GOLDEN}')
