import io

import pytest
import torch

import condtok_mm  # noqa: F401
from condtok_mm.conditioning import condition_number, condition_tokens
from condtok_mm.registry import MODELS
from mmdet.registry import MODELS as MMDET_MODELS


def test_builds_by_bare_name_from_mmdet_registry_with_defaults():
    conditioner = MMDET_MODELS.build(dict(type='TokenConditioner'))
    assert (conditioner.mode, conditioner.alpha, conditioner.target_kappa, conditioner.detach,
            conditioner.solver) == ('sigma_max', 1.0, 2.0, True, 'auto')
    assert list(conditioner.parameters()) == [] and list(conditioner.buffers()) == []
    assert conditioner.state_dict() == {}


@pytest.mark.parametrize('mode', ['sigma_max', 'floor'])
def test_forward_conditions_each_image(mode):
    conditioner = MODELS.build(dict(type='TokenConditioner', mode=mode))
    tokens = torch.nn.functional.layer_norm(torch.randn(3, 400, 24), (24, ))
    out = conditioner(tokens)
    assert out.shape == tokens.shape
    assert (condition_number(out) <= 2 + 1e-3).all()
    # each image is conditioned on its own: the result for one image does not depend on the others
    torch.testing.assert_close(conditioner(tokens[1:2]), out[1:2])


def test_a_conditioner_built_alone_names_itself_in_errors():
    # inside a backbone the backbone names the place (tests/models/test_cond_{swin,vit,wrapper}.py)
    conditioner = MODELS.build(dict(type='TokenConditioner'))
    with pytest.raises(ValueError, match='^TokenConditioner: the token matrix has 16 non-finite'):
        conditioner(torch.full((1, 4, 4), float('nan')))


def swin_attention_groups(height, width, window_size, shift_size):
    """The token groups that attend to each other in one Swin W-MSA/SW-MSA block, derived the way
    mmdet's ShiftWindowMSA builds them: pad to a multiple of the window, roll by -shift, cut into windows,
    and split each window by the region labels of its attention mask. Padded tokens are dropped.

    Returns a list of index lists into the row-major (height, width) grid.
    """
    padded_h, padded_w = -(-height // window_size) * window_size, -(-width // window_size) * window_size
    position = torch.arange(padded_h * padded_w).view(padded_h, padded_w)
    region = torch.zeros(padded_h, padded_w, dtype=torch.long)
    if shift_size:
        position = torch.roll(position, (-shift_size, -shift_size), (0, 1))
        slices = (slice(0, -window_size), slice(-window_size, -shift_size), slice(-shift_size, None))
        for label, (h, w) in enumerate((h, w) for h in slices for w in slices):
            region[h, w] = label
    groups = {}
    for r in range(padded_h):
        for c in range(padded_w):
            y, x = divmod(int(position[r, c]), padded_w)
            if y < height and x < width:
                groups.setdefault((r // window_size, c // window_size, int(region[r, c])), []).append(
                    y * width + x)
    return list(groups.values())


@pytest.mark.parametrize('hw, window_size, shift_size', [
    ((14, 21), 7, 0),  # a multiple of the window: one batched call
    ((17, 23), 7, 0),  # border windows cut by the image edge
    ((17, 23), 7, 3),  # Swin's shifted windows
    ((5, 9), 4, 2),
    ((3, 2), 4, 0),  # smaller than one window
])
@pytest.mark.parametrize('mode', ['sigma_max', 'floor'])
def test_window_scope_conditions_each_attention_window_on_its_own(hw, window_size, shift_size, mode):
    conditioner = MODELS.build(dict(type='TokenConditioner', mode=mode, scope='window',
                                    window_size=window_size, shift_size=shift_size))
    torch.manual_seed(0)
    # LayerNorm'd tokens, the rank-deficient kind a patch embedding makes
    tokens = torch.nn.functional.layer_norm(torch.randn(2, hw[0] * hw[1], 24), (24, ))
    out = conditioner(tokens, hw_shape=hw)
    groups = swin_attention_groups(*hw, window_size, shift_size)
    assert sorted(i for g in groups for i in g) == list(range(hw[0] * hw[1]))
    for group in groups:
        assert (condition_number(out[:, group]) <= 2 + 1e-3).all()
        # exactly the whole-matrix conditioning of that window's tokens, nothing else mixed in
        torch.testing.assert_close(out[:, group], condition_tokens(tokens[:, group], mode=mode))


def test_window_scope_passes_the_gradient_of_every_token():
    conditioner = MODELS.build(dict(type='TokenConditioner', scope='window', window_size=4))
    tokens = torch.randn(2, 7 * 6, 8, requires_grad=True)
    (conditioner(tokens, hw_shape=(7, 6)) * torch.arange(8.)).sum().backward()
    torch.testing.assert_close(tokens.grad, torch.arange(8.).expand(2, 42, 8))  # detach=True: C is constant



@pytest.mark.parametrize('scope', [dict(scope='image'), dict(scope='window', window_size=4)])
def test_detach_false_conditions_alike_in_training_and_evaluation(scope):
    # the gradient through the SVD runs on the reference; evaluation (no gradient) must run the same function
    # there, not the batched path, whose null-space completion differs on these rank-deficient tokens
    conditioner = MODELS.build(dict(type='TokenConditioner', detach=False, **scope))
    tokens = torch.nn.functional.layer_norm(torch.randn(2, 7 * 6, 8, dtype=torch.float64), (8, ))
    trained = conditioner.train()(tokens.clone().requires_grad_(), hw_shape=(7, 6))
    with torch.no_grad():
        evaluated = conditioner.eval()(tokens, hw_shape=(7, 6))
    torch.testing.assert_close(trained.detach(), evaluated, rtol=0, atol=1e-12)


@pytest.mark.parametrize('cfg, message', [
    (dict(scope='windows'), r"^TokenConditioner: scope='windows' is invalid; use one of 'image', 'window'$"),
    (dict(scope='window'), r'^TokenConditioner: window_size=None is invalid; use an integer >= 1 \(the side of '
     r'the attention window\)$'),
    (dict(scope='window', window_size=0), r'window_size=0 is invalid; use an integer >= 1'),
    (dict(scope='window', window_size=7, shift_size=7), r'shift_size=7 is invalid; use an integer in \[0, '
     r'window_size=7\)'),
    (dict(window_size=7), r"^TokenConditioner: window_size=7 and shift_size=0 are invalid with scope='image'"),
    (dict(shift_size=3), r"shift_size=3 are invalid with scope='image' \(it conditions the whole image\); use "
     r"them with scope='window'$"),
    (dict(position='input'), r"^TokenConditioner: position='input' is invalid; use one of 'embedding', "
     r"'attention_input'$"),
])
def test_invalid_module_options_fail_at_build_time(cfg, message):
    with pytest.raises(ValueError, match=message):
        MODELS.build(dict(type='TokenConditioner', **cfg))


def test_window_scope_needs_a_matching_token_grid_at_forward_time():
    conditioner = MODELS.build(dict(type='TokenConditioner', scope='window', window_size=4))
    conditioner.where = 'CondViT patch embedding'
    tokens = torch.randn(1, 12, 8)
    with pytest.raises(ValueError, match=r"CondViT patch embedding: scope='window' needs the token grid"):
        conditioner(tokens)
    with pytest.raises(ValueError, match=r'12 tokens do not fill the grid hw_shape=\(3, 5\)'):
        conditioner(tokens, hw_shape=(3, 5))


def test_image_scope_ignores_the_token_grid():
    conditioner = MODELS.build(dict(type='TokenConditioner'))
    tokens = torch.randn(2, 12, 8)
    torch.testing.assert_close(conditioner(tokens, hw_shape=(3, 4)), condition_tokens(tokens))


def test_the_torchscript_onnx_exporter_stops_at_the_conditioner_naming_the_exporter_that_works():
    # torch.onnx.export(dynamo=False) drops the Newton-Schulz step's in-place writes to a diagonal: its graph would
    # compute another correction, silently (tests/deployment/ check the exporter that works)
    backbone = MODELS.build(dict(type='CondSwinTransformer', embed_dims=32, depths=(1, 1, 2, 1),
                                 num_heads=(1, 2, 4, 8), window_size=4,
                                 conditioning=dict(type='TokenConditioner', solver='newton_schulz')))
    backbone.eval()  # mmdet's SwinTransformer.train() returns None: no chaining
    with pytest.raises(RuntimeError, match=r"CondSwinTransformer stage 0 \(mode='sigma_max', "
                       r"solver='newton_schulz'\): torch.onnx.export\(..., dynamo=False\), the TorchScript-based "
                       r'exporter, drops .*export with tools/deployment/export_onnx.py'):
        torch.onnx.export(backbone, (torch.randn(1, 3, 64, 64), ), io.BytesIO(), dynamo=False)


@pytest.mark.slow
def test_a_traced_conditioned_backbone_computes_what_the_module_does():
    # the deployment route for the modes that do not export to ONNX
    backbone = MODELS.build(dict(type='CondSwinTransformer', embed_dims=32, depths=(1, 1, 2, 1),
                                 num_heads=(1, 2, 4, 8), window_size=4))
    backbone.eval()
    traced = torch.jit.trace(backbone, (torch.randn(1, 3, 64, 64), ), check_trace=False)
    images = torch.randn(1, 3, 64, 64)  # another image of the traced size (tracing fixes the shapes)
    for expected, actual in zip(backbone(images), traced(images)):
        torch.testing.assert_close(actual, expected)
