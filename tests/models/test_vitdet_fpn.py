import pytest
import torch
from mmcv.cnn import build_norm_layer
from mmdet.registry import MODELS as MMDET_MODELS

import condtok_mm  # noqa: F401
from condtok_mm.models.necks import ViTDetFPN, ViTDetLN2d
from condtok_mm.registry import MODELS

SMALL = dict(backbone_channel=32, in_channels=[8, 16, 32, 32], out_channels=24, num_outs=5,
             norm_cfg=dict(type='ViTDetLN2d', requires_grad=True))

# The state dict of mmdet 3.3.0 projects/ViTDet `SimpleFPN(**SMALL)` with LN2d norms, as read from
# simple_fpn.py: fpn1 = ConvTranspose2d, LN2d, GELU, ConvTranspose2d (indices 0, 1, 3); fpn2 = one
# ConvTranspose2d; then per level a 1x1 lateral and a 3x3 output ConvModule, whose norm mmcv names
# 'norm_layer' (LN2d is no LayerNorm subclass) and whose conv has no bias (it is followed by a norm).
SIMPLE_FPN_KEYS = [('fpn1.0.weight', (32, 16, 2, 2)), ('fpn1.0.bias', (16, )), ('fpn1.1.weight', (16, )),
                   ('fpn1.1.bias', (16, )), ('fpn1.3.weight', (16, 8, 2, 2)), ('fpn1.3.bias', (8, )),
                   ('fpn2.0.weight', (32, 16, 2, 2)), ('fpn2.0.bias', (16, ))]
for _kind, _in, _k in (('lateral_convs', [8, 16, 32, 32], 1), ('fpn_convs', [24] * 4, 3)):
    for _i in range(4):
        SIMPLE_FPN_KEYS += [(f'{_kind}.{_i}.conv.weight', (24, _in[_i], _k, _k)),
                            (f'{_kind}.{_i}.norm_layer.weight', (24, )), (f'{_kind}.{_i}.norm_layer.bias', (24, ))]


def test_builds_by_bare_name_and_leaves_upstream_names_free():
    neck = MMDET_MODELS.build(dict(type='ViTDetFPN', **SMALL))
    assert isinstance(neck, ViTDetFPN) and isinstance(neck.fpn1[1], ViTDetLN2d)
    assert not {'SimpleFPN', 'LN2d'} & set(MODELS.module_dict)


def test_state_dict_is_simple_fpns():
    neck = MODELS.build(dict(type='ViTDetFPN', **SMALL))
    assert [(k, tuple(v.shape)) for k, v in neck.state_dict().items()] == SIMPLE_FPN_KEYS


@pytest.mark.parametrize('grid', [(8, 8), (5, 7), (2, 3)])
def test_levels_have_strides_4_to_64_of_the_image(grid):
    neck = MODELS.build(dict(type='ViTDetFPN', **SMALL))
    height, width = grid  # the stride-16 map of a (16 H, 16 W) image
    outs = neck(torch.randn(2, 32, height, width))
    expected = [(4 * height, 4 * width), (2 * height, 2 * width), (height, width), (height // 2, width // 2)]
    expected.append(((expected[-1][0] + 1) // 2, (expected[-1][1] + 1) // 2))
    assert [tuple(o.shape) for o in outs] == [(2, 24, *hw) for hw in expected]


def test_stride_16_level_sees_the_backbone_map_through_its_convs_only():
    neck = MODELS.build(dict(type='ViTDetFPN', **SMALL)).eval()
    x = torch.randn(1, 32, 6, 6)
    with torch.no_grad():
        want = neck.fpn_convs[2](neck.lateral_convs[2](x))
        assert torch.equal(neck(x)[2], want)
        torch.testing.assert_close(neck(x)[3], neck.fpn_convs[3](neck.lateral_convs[3](
            torch.nn.functional.max_pool2d(x, 2))))
        torch.testing.assert_close(neck(x)[4], neck(x)[3][:, :, ::2, ::2])


def test_ln2d_normalizes_the_channels_at_every_position():
    _, norm = build_norm_layer(dict(type='ViTDetLN2d'), 6)
    assert norm.eps == 1e-5  # mmcv's build_norm_layer default, as for mmdet's LN2d in ViTDet's neck and heads
    norm.double()
    with torch.no_grad():
        norm.weight.copy_(torch.arange(1., 7.))
        norm.bias.copy_(torch.arange(6.) / 10)
    x = torch.randn(2, 6, 3, 5, dtype=torch.float64) * 4 + 1
    mean = x.mean(1, keepdim=True)
    var = ((x - mean)**2).mean(1, keepdim=True)
    want = (x - mean) / torch.sqrt(var + 1e-5) * norm.weight[:, None, None] + norm.bias[:, None, None]
    torch.testing.assert_close(norm(x), want)


def test_in_channels_must_be_the_branch_channels():
    with pytest.raises(ValueError, match=r'in_channels=\[192, 384, 768, 768\] must be .* from a 256-channel '
                       r'map: \[64, 128, 256, 256\]'):
        MODELS.build(dict(type='ViTDetFPN', backbone_channel=256, in_channels=[192, 384, 768, 768],
                          out_channels=256))
