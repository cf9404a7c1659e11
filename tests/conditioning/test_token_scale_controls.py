"""The token-scale controls of the conditioner against float64 numpy: r = ||X + C||_F / ||X||_F per image,
scale-matched r X, norm-matched (X + C) / r, r constant in backward."""
import numpy as np
import pytest
import torch

import condtok_mm  # noqa: F401
from condtok_mm.conditioning import condition_number, condition_token_windows, condition_tokens
from condtok_mm.registry import MODELS


def numpy_conditioned(x):
    """The paper's X + C = U (S + s_1 I) V^T (target kappa 2) of a full-rank matrix, float64 numpy."""
    u, s, vt = np.linalg.svd(x, full_matrices=False)
    return (u * (s + s[0])) @ vt


def numpy_control(x, control):
    conditioned = numpy_conditioned(x)
    ratio = np.linalg.norm(conditioned) / np.linalg.norm(x)
    return (ratio * x if control == 'scale_matched' else conditioned / ratio), ratio


def tokens(batch, num_tokens, channels, seed=0):
    generator = torch.Generator().manual_seed(seed)
    # unequal channel scales: kappa of X well above 2, so the correction changes the scale noticeably
    return torch.randn(batch, num_tokens, channels, generator=generator, dtype=torch.float64) \
        * torch.logspace(0, 2, channels, dtype=torch.float64)


@pytest.mark.parametrize('control', ['scale_matched', 'norm_matched'])
@pytest.mark.parametrize('solver', ['reference_gram', 'reference_svd'])
def test_each_image_matches_numpy(control, solver):
    conditioner = MODELS.build(dict(type='TokenConditioner', solver=solver, control=control))
    x = tokens(3, 64, 8)
    out = conditioner(x)
    for image in range(3):
        expected, ratio = numpy_control(x[image].numpy(), control)
        assert ratio > 1.5  # the scale really changes, so that the two controls differ from X and X + C
        np.testing.assert_allclose(out[image].numpy(), expected, rtol=1e-9, atol=1e-9 * np.abs(expected).max())
    if control == 'norm_matched':  # kappa of the conditioned tokens at the tokens' own scale
        assert (condition_number(out) <= 2 + 1e-9).all()
        torch.testing.assert_close(out.flatten(1).norm(dim=1), x.flatten(1).norm(dim=1))
    else:  # kappa of the tokens at the conditioned tokens' scale
        torch.testing.assert_close(condition_number(out), condition_number(x))


@pytest.mark.parametrize('control', ['scale_matched', 'norm_matched'])
def test_padded_batch_uses_each_images_valid_tokens_and_leaves_the_padding(control):
    # the reference conditioning, so that the numpy formula is exact; the control itself is solver-independent
    conditioner = MODELS.build(dict(type='TokenConditioner', control=control, solver='reference_gram'))
    height, width, channels = 6, 8, 4
    x = tokens(2, height * width, channels, seed=1)
    valid_shapes = [(6, 8), (4, 5)]
    out = conditioner(x, hw_shape=(height, width), valid_shapes=valid_shapes)
    grid, out_grid = x.view(2, height, width, channels), out.view(2, height, width, channels)
    for image, (h, w) in enumerate(valid_shapes):
        expected, _ = numpy_control(grid[image, :h, :w].reshape(h * w, channels).numpy(), control)
        np.testing.assert_allclose(out_grid[image, :h, :w].reshape(h * w, channels).numpy(), expected,
                                   rtol=1e-9, atol=1e-9 * np.abs(expected).max())
    torch.testing.assert_close(out_grid[1, 4:], grid[1, 4:], rtol=0, atol=0)
    torch.testing.assert_close(out_grid[1, :4, 5:], grid[1, :4, 5:], rtol=0, atol=0)


@pytest.mark.parametrize('control', ['scale_matched', 'norm_matched'])
def test_the_ratio_is_a_constant_in_backward(control):
    conditioner = MODELS.build(dict(type='TokenConditioner', control=control, solver='reference_gram'))  # C constant
    x = tokens(2, 32, 4, seed=2).requires_grad_()
    weights = torch.randn(x.shape, dtype=torch.float64)
    (conditioner(x) * weights).sum().backward()
    ratios = torch.tensor([numpy_control(image.detach().numpy(), control)[1] for image in x])[:, None, None]
    expected = weights * ratios if control == 'scale_matched' else weights / ratios
    torch.testing.assert_close(x.grad, expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize('control', ['scale_matched', 'norm_matched'])
def test_zero_tokens_stay_zero_and_finite(control):
    conditioner = MODELS.build(dict(type='TokenConditioner', control=control))
    out = conditioner(torch.zeros(2, 16, 4))
    assert torch.equal(out, torch.zeros(2, 16, 4))


def test_unknown_control_fails_at_build_time_naming_the_choices():
    with pytest.raises(ValueError, match="^TokenConditioner: control='scale' is invalid; use None \\(the method\\) "
                                         "or one of 'scale_matched', 'norm_matched'$"):
        MODELS.build(dict(type='TokenConditioner', control='scale'))


@pytest.mark.parametrize('control', ['scale_matched', 'norm_matched'])
def test_the_functional_api_applies_the_control_as_the_conditioner_does(control):
    x = tokens(2, 6 * 8, 4, seed=3)
    conditioner = MODELS.build(dict(type='TokenConditioner', control=control, solver='reference_gram'))
    got = condition_tokens(x, control=control, solver='reference_gram')
    assert torch.equal(got, conditioner(x))
    for image in range(2):
        expected, _ = numpy_control(x[image].numpy(), control)
        np.testing.assert_allclose(got[image].numpy(), expected, rtol=1e-9, atol=1e-9 * np.abs(expected).max())
    # per window the ratio is still one per image: that of the windows' X + C over the whole image
    windows = condition_token_windows(x, (6, 8), 4, solver='reference_gram')
    ratio = (windows.flatten(1).norm(dim=1) / x.flatten(1).norm(dim=1))[:, None, None]
    want = x * ratio if control == 'scale_matched' else windows / ratio
    torch.testing.assert_close(condition_token_windows(x, (6, 8), 4, control=control, solver='reference_gram'), want,
                               rtol=1e-12, atol=0)


def test_control_reaches_the_demo_backbone_from_a_config_option():
    """The suites switch the controls with model.backbone.conditioning.control=...; the demo Swin's stage-0
    conditioner must then output (X + C) / r: the tokens' own norm, kappa <= 2."""
    from mmengine.config import Config
    cfg = Config.fromfile('configs/demo/mask-rcnn_swin-mini-condtok_fpn_12e_shapes.py')
    cfg.merge_from_dict({'model.backbone.conditioning.control': 'norm_matched'})
    backbone = MODELS.build(cfg.model.backbone)
    conditioners = [module for module in backbone.modules() if type(module).__name__ == 'TokenConditioner']
    assert len(conditioners) == 1
    seen = []
    conditioners[0].register_forward_hook(lambda module, args, out: seen.append((args[0], out)))
    with torch.no_grad():
        backbone(torch.randn(1, 3, 64, 64))
    (x, out), = seen
    torch.testing.assert_close(out.norm(), x.norm())
    assert condition_number(out[0].double()) <= 2 + 1e-3 < condition_number(x[0].double())
