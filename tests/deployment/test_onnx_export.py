"""ONNX export of conditioned backbones (condtok_mm.deployment): onnxruntime computes what PyTorch computes, and the
exported conditioner meets kappa(X + C) <= 2."""
import os.path as osp

import numpy as np
import pytest
import torch
from helpers.repo import REPO_ROOT
from mmengine.config import Config

from condtok_mm.conditioning import condition_number
from condtok_mm.deployment import export_onnx, run_onnxruntime, use_exportable_solver
from condtok_mm.deployment.parity import output_parity
from condtok_mm.registry import MODELS

DEMO_VITDET = osp.join(REPO_ROOT, 'configs', 'demo', 'mask-rcnn_vit-mini-vitdet-condtok_simple-fpn_12e_shapes.py')
SWIN_T = osp.join(REPO_ROOT, 'configs', 'swin', 'mask-rcnn_swin-t-p4-w7-condtok_fpn_1x_coco.py')
# kappa of the exported graph's X + C: the bound 2 (Newton-Schulz meets it within 1e-4 on rank-deficient tokens)
# with float32's rounding of the output.
KAPPA_BOUND = 2 * (1 + 1e-3)


def _demo_backbone(config):
    cfg = Config.fromfile(config).model.backbone
    cfg.pop('init_cfg', None)  # random weights: nothing is downloaded
    backbone = MODELS.build(cfg)
    backbone.eval()  # mmdet's SwinTransformer.train() returns None: no chaining
    return backbone


def _parity(module, image, path):
    """Each output's OutputParity on ``image``; every one within tolerance."""
    parity = output_parity(module, path, {'image': image})
    assert all(output.within_tolerance for output in parity), parity
    return parity


class _Conditioner(torch.nn.Module):
    """A TokenConditioner on one fixed token grid: the exported graph takes the tokens only."""

    def __init__(self, conditioner, hw_shape):
        super().__init__()
        self.conditioner = conditioner
        self.hw_shape = hw_shape

    def forward(self, tokens):
        return self.conditioner(tokens, self.hw_shape)


@pytest.mark.slow
def test_the_exported_conditioner_bounds_kappa_at_swin_t_size(tmp_path):
    # Swin-T's stage-0 tokens at 224 x 224: 56 x 56 tokens of 96 channels, LayerNorm'd (rank 95: X 1 = 0), the
    # whole-image two-pass path
    tokens = torch.nn.functional.layer_norm(torch.randn(1, 56 * 56, 96, generator=torch.Generator().manual_seed(0)),
                                            (96, ))
    module = _Conditioner(MODELS.build(dict(type='TokenConditioner', solver='newton_schulz')), (56, 56))
    path = export_onnx(module, (tokens, ), str(tmp_path / 'conditioner.onnx'), ['tokens'], ['conditioned'])
    (conditioned, ) = run_onnxruntime(path, {'tokens': tokens.numpy()}, threads=1)
    expected = module(tokens)
    assert condition_number(tokens).item() > 1e6
    assert condition_number(torch.from_numpy(conditioned)).item() <= KAPPA_BOUND
    correction = (expected - tokens).abs().max().item()
    assert np.abs(conditioned - expected.numpy()).max() <= 1e-5 * correction
    # the graph cannot raise on a non-finite token (PyTorch does): the image passes through unconditioned, that
    # token NaN in every channel
    broken = tokens.clone()
    broken[0, 5, 3] = float('nan')
    (passed, ) = run_onnxruntime(path, {'tokens': broken.numpy()}, threads=1)
    assert np.isnan(passed[0, 5]).all() and np.isnan(passed).sum() == 96
    np.testing.assert_array_equal(np.delete(passed, 5, axis=1), np.delete(broken.numpy(), 5, axis=1))


@pytest.mark.slow
def test_the_exported_conditioner_bounds_kappa_per_window(tmp_path):
    # ViTDet-B's window blocks: 14 x 14 windows of 768 channels (fewer tokens than channels: the short-side Gram
    # matrix), on a 28 x 28 grid (four windows); tokens of rank 32, LayerNorm'd
    generator = torch.Generator().manual_seed(1)
    low_rank = torch.randn(1, 28 * 28, 32, generator=generator) @ torch.randn(32, 768, generator=generator)
    tokens = torch.nn.functional.layer_norm(low_rank, (768, ))
    conditioner = MODELS.build(dict(type='TokenConditioner', solver='newton_schulz', scope='window', window_size=14))
    module = _Conditioner(conditioner, (28, 28))
    path = export_onnx(module, (tokens, ), str(tmp_path / 'windows.onnx'), ['tokens'], ['conditioned'])
    (conditioned, ) = run_onnxruntime(path, {'tokens': tokens.numpy()}, threads=1)
    expected = module(tokens)
    def windows(grid):
        return grid.view(2, 14, 2, 14, 768).permute(0, 2, 1, 3, 4).reshape(4, 196, 768)
    assert condition_number(windows(tokens)).min().item() > 1e6
    assert condition_number(windows(torch.from_numpy(conditioned))).max().item() <= KAPPA_BOUND
    # fewer tokens than channels: Newton-Schulz's smallest directions carry more round-off (eigh and Newton-Schulz
    # agree within 1e-3 there, tests/conditioning/test_conditioning_batched.py); two runtimes' float64 products
    # differ by 8e-6 of max |C| here
    assert np.abs(conditioned - expected.numpy()).max() <= 1e-4 * (expected - tokens).abs().max().item()


@pytest.mark.slow
def test_the_vitdet_demo_backbone_exports_and_onnxruntime_matches_pytorch(tmp_path):
    backbone = _demo_backbone(DEMO_VITDET)
    assert use_exportable_solver(backbone) == [
        "CondViT patch embedding: solver='auto' -> 'newton_schulz' for the export (ONNX has no eigendecomposition "
        'operator; Newton-Schulz gives the same X + C within 1e-4, matrix products only)']
    image = torch.zeros(1, 3, 64, 64)
    path = export_onnx(backbone, (image, ), str(tmp_path / 'vitdet.onnx'), ['image'], ['feat0'])
    other = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(3))
    _parity(backbone, other, path)


@pytest.mark.slow
def test_the_swin_t_backbone_exports_and_onnxruntime_matches_pytorch(tmp_path):
    # the full-size Swin-T backbone of the COCO config (12 blocks, d 96-768) on a small image: 112 x 160 px, 28 x 40
    # stage-0 tokens, windows of 7 in every stage but the last, which pads its 4 x 5 grid to one window
    backbone = _demo_backbone(SWIN_T)
    assert use_exportable_solver(backbone) == [
        "CondSwinTransformer stage 0: solver='auto' -> 'newton_schulz' for the export (ONNX has no "
        'eigendecomposition operator; Newton-Schulz gives the same X + C within 1e-4, matrix products only)']
    image = torch.randn(1, 3, 112, 160, generator=torch.Generator().manual_seed(5))
    path = export_onnx(backbone, (image, ), str(tmp_path / 'swin-t.onnx'), ['image'], [f'feat{i}' for i in range(4)])
    parity = _parity(backbone, image, path)
    assert [output.shape for output in parity] == [(1, 96, 28, 40), (1, 192, 14, 20), (1, 384, 7, 10), (1, 768, 4, 5)]


@pytest.mark.slow
def test_a_wrapped_backbone_exports_and_onnxruntime_matches_pytorch(tmp_path):
    backbone = MODELS.build(dict(
        type='CondTokBackbone', backbone=dict(type='mmdet.SwinTransformer', embed_dims=32, depths=(1, 1, 2, 1),
                                              num_heads=(1, 2, 4, 8), window_size=4),
        conditioning=dict(type='TokenConditioner', solver='newton_schulz'))).eval()
    image = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(4))
    path = export_onnx(backbone, (image, ), str(tmp_path / 'wrapped.onnx'), ['image'],
                       [f'feat{i}' for i in range(4)])
    _parity(backbone, image, path)


def test_use_exportable_solver_switches_eigh_and_refuses_modes_without_a_matrix_product_form():
    backbone = MODELS.build(dict(type='CondSwinTransformer', embed_dims=16, depths=(1, 1), num_heads=(1, 2),
                                 strides=(4, 2), out_indices=(0, 1), window_size=4, condition_stages=(0, 1),
                                 conditioning=dict(type='TokenConditioner', solver='eigh')))
    assert use_exportable_solver(backbone) == [
        f"CondSwinTransformer stage {stage}: solver='eigh' -> 'newton_schulz' for the export (ONNX has no "
        'eigendecomposition operator; Newton-Schulz gives the same X + C within 1e-4, matrix products only)'
        for stage in (0, 1)]
    assert {conditioner.solver for conditioner in backbone.conditioners.values()} == {'newton_schulz'}
    assert use_exportable_solver(backbone) == []
    floor = MODELS.build(dict(type='CondViT', embed_dim=32, depth=1, num_heads=2, img_size=32, patch_size=16,
                              window_size=0, window_block_indexes=(),
                              conditioning=dict(type='TokenConditioner', mode='floor')))
    with pytest.raises(ValueError, match=r"^CondViT patch embedding \(mode='floor', solver='auto'\) cannot be "
                       r"exported to ONNX: only mode='sigma_max' on the batched path"):
        use_exportable_solver(floor)


def test_exporting_an_eigh_conditioner_stops_at_it_naming_the_solver_to_set(tmp_path):
    conditioner = MODELS.build(dict(type='TokenConditioner', solver='eigh'))
    conditioner.where = 'CondSwinTransformer stage 0'
    with pytest.raises(Exception, match=r"CondSwinTransformer stage 0 \(mode='sigma_max', "
                       r"solver='eigh'\) cannot be exported to ONNX as it is: .*set solver='newton_schulz'"):
        export_onnx(_Conditioner(conditioner, (4, 4)), (torch.randn(1, 16, 8), ), str(tmp_path / 'eigh.onnx'),
                    ['tokens'], ['conditioned'])
