"""Each image is conditioned on its own valid tokens: batch padding never enters its token matrix."""
import copy
import os.path as osp

import numpy as np
import pytest
import torch
from mmdet.models.data_preprocessors import DetDataPreprocessor
from mmdet.testing import demo_mm_inputs
from mmengine.config import Config
from mmengine.registry import init_default_scope

import condtok_mm  # noqa: F401
from condtok_mm.conditioning import condition_number, condition_tokens
from condtok_mm.models import TokenConditioner
from condtok_mm.models.valid_region import (batch_valid_region, record_valid_region, valid_token_shapes)
from condtok_mm.registry import MODELS
from helpers.repo import REPO_ROOT
from helpers.tokens import random_tokens

DEMO_SWIN = osp.join(REPO_ROOT, 'configs', 'demo', 'mask-rcnn_swin-mini-condtok_fpn_12e_shapes.py')
DEMO_VIT = osp.join(REPO_ROOT, 'configs', 'demo', 'mask-rcnn_vit-mini-vitdet-condtok_simple-fpn_12e_shapes.py')


def build_detector(config, **conditioning):
    cfg = Config.fromfile(config)
    cfg.model.backbone.conditioning.update(conditioning)
    init_default_scope('mmdet')
    torch.manual_seed(0)
    return MODELS.build(cfg.model).eval()


def conditioner_outputs(detector, data):
    """Run ``data`` through ``test_step`` and return what the backbone's conditioner returned, (B, H, W, C)."""
    conditioner = next(m for m in detector.backbone.modules() if isinstance(m, TokenConditioner))
    seen = []

    def keep(module, args, output):
        tokens, (height, width) = args[0], args[1]
        seen.append(output.detach().reshape(tokens.shape[0], height, width, -1))

    handle = conditioner.register_forward_hook(keep)
    with torch.no_grad():
        detector.test_step(copy.deepcopy(data))
    handle.remove()
    assert len(seen) == 1
    return seen[0]


@pytest.mark.parametrize('config, conditioning, stride', [
    (DEMO_SWIN, {}, 4),
    (DEMO_SWIN, dict(scope='window'), 4),
    (DEMO_VIT, {}, 16),
    (DEMO_VIT, dict(scope='window'), 16),
], ids=['swin-image', 'swin-window', 'vit-image', 'vit-window'])
@pytest.mark.slow
def test_an_image_gets_the_same_correction_alone_and_beside_a_larger_image(config, conditioning, stride):
    detector = build_detector(config, **conditioning)
    # a 100 x 120 image (padded even alone, to the size divisor or the fixed LSJ-style size) and a wider one
    batch = demo_mm_inputs(2, image_shapes=[(3, 100, 120), (3, 128, 192)], num_items=[2, 2], with_mask=True)
    alone = dict(inputs=batch['inputs'][:1], data_samples=batch['data_samples'][:1])
    valid_h, valid_w = -(-100 // stride), -(-120 // stride)

    by_itself = conditioner_outputs(detector, alone)[0]
    with_mate = conditioner_outputs(detector, batch)[0]
    assert with_mate.shape[1] > by_itself.shape[1]  # the batch-mate widened the padded grid
    torch.testing.assert_close(with_mate[:valid_h, :valid_w], by_itself[:valid_h, :valid_w], rtol=1e-4, atol=1e-5)

    # the same image run through mmdet's plain DetDataPreprocessor is conditioned with its padding
    plain = copy.deepcopy(detector)
    plain.data_preprocessor = DetDataPreprocessor(**{k: v for k, v in Config.fromfile(config).model.data_preprocessor.items()
                                                     if k != 'type'})
    padded = conditioner_outputs(plain, batch)[0]
    assert (padded[:valid_h, :valid_w] - with_mate[:valid_h, :valid_w]).abs().max() > 1e-2


def test_preprocessor_returns_exactly_what_mmdets_returns_and_records_img_shapes():
    cfg = dict(mean=[123.675, 116.28, 103.53], std=[58.395, 57.12, 57.375], bgr_to_rgb=True, pad_size_divisor=32,
               pad_mask=True, batch_augments=[dict(type='BatchFixedSizePad', size=(160, 224), pad_mask=True)])
    init_default_scope('mmdet')
    ours = MODELS.build(dict(type='ValidRegionDetDataPreprocessor', **cfg))
    theirs = DetDataPreprocessor(**cfg)
    batch = demo_mm_inputs(2, image_shapes=[(3, 100, 120), (3, 64, 150)], num_items=[1, 1], with_mask=True)
    got, want = ours(copy.deepcopy(batch), True), theirs(copy.deepcopy(batch), True)
    assert torch.equal(got['inputs'], want['inputs']) and got['inputs'].shape[-2:] == (160, 224)
    for a, b in zip(got['data_samples'], want['data_samples']):
        assert a.metainfo.keys() == b.metainfo.keys()
        assert all(np.array_equal(a.metainfo[k], b.metainfo[k]) for k in a.metainfo)
        assert torch.equal(a.gt_instances.masks.to_tensor(torch.bool, 'cpu'),
                           b.gt_instances.masks.to_tensor(torch.bool, 'cpu'))
    region = batch_valid_region(got['inputs'])
    assert region.img_shapes == ((100, 120), (64, 150)) and region.batch_hw == (160, 224)
    assert batch_valid_region(want['inputs']) is None  # tied to the very tensor it returned
    assert batch_valid_region(batch_size=2) is region and batch_valid_region(batch_size=3) is None


def test_region_is_forgotten_with_its_batch():
    inputs = torch.zeros(1, 3, 64, 64)
    record_valid_region(inputs, [(30, 40, 3)])
    assert batch_valid_region(batch_size=1).img_shapes == ((30, 40), )
    del inputs
    assert batch_valid_region(batch_size=1) is None


@pytest.mark.parametrize('batch_hw, grid, stride, want', [
    ((128, 192), (32, 48), None, [(25, 30), (32, 48)]),   # Swin stride 4: ceil(100 / 4), ceil(120 / 4)
    ((128, 192), (16, 24), None, [(13, 15), (16, 24)]),   # stride 8 (after a patch merging)
    ((128, 190), (4, 6), None, [(4, 4), (4, 6)]),         # stride 32 read off the side that is a multiple of it
    ((130, 190), (33, 48), 4, [(25, 30), (33, 48)]),      # a batch not a multiple of the stride (Swin pads it)
    ((130, 190), (5, 6), 32, [(4, 4), (5, 6)]),           # stride 32 there: the fifth row holds no valid pixel
    ((130, 190), (4, 5), (32, 32), [(4, 4), (4, 5)]),     # a convolution that drops the partial patch (floor)
    ((1024, 1024), (64, 64), None, [(7, 8), (64, 64)]),   # ViTDet stride 16
])
def test_valid_token_shapes_count_every_token_that_holds_a_valid_pixel(batch_hw, grid, stride, want):
    inputs = torch.zeros(2, 3, *batch_hw)
    record_valid_region(inputs, [(100, 120), batch_hw])
    assert valid_token_shapes(batch_valid_region(inputs), grid, stride) == want


def test_valid_token_shapes_refuse_a_stride_they_cannot_know():
    inputs = torch.zeros(2, 3, 130, 190)
    record_valid_region(inputs, [(120, 120), (130, 190)])
    region = batch_valid_region(inputs)
    # the batch is not a multiple of the grid: the stride cannot be read off the sizes (a guess of
    # round(130 / 5) = 26 counted a fifth valid row for the 120-pixel image)
    with pytest.raises(ValueError, match=r'^stage 3: the stride of a \(5, 6\) token grid cannot be told from its '
                                         r"\(130, 190\) batch, which is not a multiple of it; pad batches to a "
                                         r"multiple of the stride \(the data preprocessor's pad_size_divisor"):
        valid_token_shapes(region, (5, 6), where='stage 3')
    with pytest.raises(ValueError, match=r'stride=16 does not make a \(5, 6\) token grid from a \(130, 190\) batch'):
        valid_token_shapes(region, (5, 6), 16)


@pytest.mark.parametrize('batch_hw', [(130, 190), (160, 192)])
def test_swin_conditions_every_stage_on_the_tokens_that_hold_valid_pixels(batch_hw):
    # a batch that is not a multiple of the deepest stride (32), as a host config's pad_size_divisor may leave it
    init_default_scope('mmdet')
    swin = MODELS.build(dict(type='CondSwinTransformer', embed_dims=8, depths=(1, 1, 1, 1), num_heads=(1, 1, 1, 1),
                             window_size=2, condition_stages=(0, 1, 2, 3)))
    swin.eval()  # mmdet's SwinTransformer.train returns None
    inputs = torch.zeros(2, 3, *batch_hw)
    record_valid_region(inputs, [(120, 100), batch_hw])
    with torch.no_grad():
        swin(inputs)
    for stage, stride in enumerate((4, 8, 16, 32)):
        hw_shape, valid_shapes = swin._stage_grid[stage]
        assert valid_shapes[0] == (-(-120 // stride), -(-100 // stride)), (stage, hw_shape, valid_shapes)


def test_valid_token_shapes_is_none_when_nothing_is_padded():
    inputs = torch.zeros(2, 3, 64, 96)
    record_valid_region(inputs, [(64, 96), (64, 96)])
    assert valid_token_shapes(batch_valid_region(inputs), (16, 24)) is None
    assert valid_token_shapes(None, (16, 24)) is None


@pytest.mark.parametrize('scope', ['image', 'window'])
@pytest.mark.parametrize('centred', [False, True])
def test_conditioner_conditions_each_images_valid_tokens_and_passes_padding(scope, centred):
    height, width, channels = 9, 11, 16
    tokens = random_tokens(3, height * width, channels, 1e3, dtype=torch.float64)
    valid = [(9, 11), (5, 7), (0, 0)]  # full, padded, wholly padded
    window = dict(window_size=4) if scope == 'window' else {}
    conditioner = TokenConditioner(scope=scope, centred=centred, **window)
    out = conditioner(tokens, (height, width), valid).view(3, height, width, channels)
    grid = tokens.view(3, height, width, channels)
    for image, (h, w) in enumerate(valid):
        if h:
            alone = conditioner(grid[image:image + 1, :h, :w].reshape(1, h * w, channels), (h, w))
            # equal below float32's resolution: BLAS may sum a padded batch's products in another order than one
            # image's (1e-13 apart on an AVX2 CPU), and a stack of at most ACCURATE_ROWS x d rows (the image alone)
            # takes its singular values from u~ V where the padded batch takes them from the eigenvalues (6e-10)
            torch.testing.assert_close(out[image, :h, :w], alone.view(h, w, channels), rtol=1e-8,
                                       atol=1e-9 * float(alone.abs().max()))
        padding = torch.ones(height, width, dtype=torch.bool)
        padding[:h, :w] = False
        assert torch.equal(out[image][padding], grid[image][padding])
    # the valid part of image 1, checked against the numpy-backed reference of the math module
    if scope == 'image':
        want = condition_tokens(grid[1, :5, :7].reshape(35, channels), centred=centred)
        np.testing.assert_allclose(out[1, :5, :7].reshape(35, channels).numpy(), want.numpy(), rtol=1e-10, atol=1e-10)


def test_conditioner_with_valid_shapes_passes_the_gradient_to_every_token():
    tokens = random_tokens(2, 6 * 5, 8, 1e2).requires_grad_(True)
    TokenConditioner()(tokens, (6, 5), [(6, 5), (3, 2)]).sum().backward()
    torch.testing.assert_close(tokens.grad, torch.ones_like(tokens))  # C is a constant (detach=True)


def test_valid_shapes_need_the_grid_and_one_shape_per_image():
    conditioner = TokenConditioner()
    with pytest.raises(ValueError, match='valid_shapes needs the token grid'):
        conditioner(torch.randn(2, 12, 4), valid_shapes=[(3, 4), (2, 2)])
    with pytest.raises(ValueError, match='1 valid_shapes for a batch of 2'):
        conditioner(torch.randn(2, 12, 4), (3, 4), [(3, 4)])


def test_wrapper_conditions_each_image_on_its_valid_tokens():
    init_default_scope('mmdet')
    torch.manual_seed(0)
    swin = dict(type='SwinTransformer', embed_dims=16, depths=(1, 1), num_heads=(1, 2), window_size=4,
                out_indices=(0, 1), strides=(4, 2))
    wrapper = MODELS.build(dict(type='CondTokBackbone', backbone=swin, targets=('patch_embed', ))).eval()
    conditioner = wrapper.conditioners['patch_embed'].conditioner
    image = torch.randn(1, 3, 40, 52)
    alone = torch.nn.functional.pad(image, (0, 12, 0, 24))
    with_mate = torch.cat([torch.nn.functional.pad(image, (0, 44, 0, 24)), torch.randn(1, 3, 64, 96)])
    outputs = []
    handle = conditioner.register_forward_hook(
        lambda m, a, out: outputs.append(out.detach().view(out.shape[0], *a[1], -1)))
    for batch, shapes in ((alone, [(40, 52)]), (with_mate, [(40, 52), (64, 96)])):
        record_valid_region(batch, shapes)
        with torch.no_grad():
            wrapper(batch)
    handle.remove()
    torch.testing.assert_close(outputs[0][0, :10, :13], outputs[1][0, :10, :13], rtol=1e-4, atol=1e-5)
    assert condition_number(outputs[1][0, :10, :13].reshape(130, 16)) <= 2 + 1e-3


@pytest.mark.parametrize('scope', ['image', 'window'])
def test_neck_conditions_each_image_on_its_valid_tokens(scope):
    init_default_scope('mmdet')
    torch.manual_seed(0)
    window = dict(window_size=4) if scope == 'window' else {}
    neck = MODELS.build(dict(type='CondTokNeck', neck=dict(type='FPN', in_channels=[8, 16], out_channels=8,
                                                            num_outs=2),
                             conditioning=dict(type='TokenConditioner', scope=scope, **window))).eval()
    levels = [torch.randn(1, 8, 10, 13), torch.randn(1, 16, 5, 7)]  # an image's valid 40 x 52 pixels
    outputs = []
    handle = neck.conditioner.register_forward_hook(lambda m, a, out: outputs.append(out.detach()))
    for batch_hw, mates in (((64, 64), 0), ((64, 96), 1)):
        grids = [(batch_hw[0] // 4, batch_hw[1] // 4), (batch_hw[0] // 8, batch_hw[1] // 8)]
        features = tuple(torch.cat([torch.nn.functional.pad(f, (0, w - f.shape[-1], 0, h - f.shape[-2]), value=3.)]
                                   + [torch.randn(1, f.shape[1], h, w)] * mates)
                         for f, (h, w) in zip(levels, grids))
        batch = torch.zeros(1 + mates, 3, *batch_hw)
        record_valid_region(batch, [(40, 52)] + [batch_hw] * mates)
        with torch.no_grad():
            neck(features)
    handle.remove()
    for level, (h, w) in enumerate([(10, 13), (5, 7)]):
        alone, with_mate = outputs[level], outputs[2 + level]
        grid = (lambda t, width: t[0].view(-1, width, t.shape[-1]))
        torch.testing.assert_close(grid(alone, 64 // 4 // 2 ** level)[:h, :w],
                                   grid(with_mate, 96 // 4 // 2 ** level)[:h, :w], rtol=1e-4, atol=1e-5)


def test_bare_tokens_of_a_padded_batch_are_refused_by_the_wrapper():
    init_default_scope('mmdet')
    wrapper = MODELS.build(dict(type='CondTokBackbone', backbone=dict(
        type='SwinTransformer', embed_dims=16, depths=(1, 1), num_heads=(1, 2), window_size=4, strides=(4, 2),
        out_indices=(0, 1)),
        targets=('patch_embed.norm', )))  # a LayerNorm: (B, N, C) tokens, no grid beside them
    batch = torch.randn(2, 3, 32, 32)
    record_valid_region(batch, [(32, 32), (16, 32)])
    with pytest.raises(ValueError, match=r'a padded batch \(to tell its padding from its tokens\) needs the token '
                                         'grid'):
        wrapper(batch)
