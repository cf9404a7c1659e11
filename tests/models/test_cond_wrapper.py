import pytest
import torch
import torch.nn as nn
from mmengine.config import Config, ConfigDict
from mmengine.registry import init_default_scope
from mmengine.structures import LabelData  # noqa: F401  (mmpretrain data samples need mmengine structures)

import condtok_mm  # noqa: F401
from condtok_mm.conditioning import condition_number
from condtok_mm.registry import MODELS
from helpers.repo import REPO_ROOT

# Swin-T's and DaViT-T's layout at a twelfth of their width and a quarter of their depth: the same modules, so
from helpers.tokens import window_matrices

# Swin-T's and DaViT-T's layout at a twelfth of their width and a quarter of their depth: the same modules, so
# the same hooks and token layouts, for a fraction of the time
SMALL_HIERARCHY = dict(embed_dims=32, depths=[1, 1, 1, 1], num_heads=[1, 2, 4, 8])
BACKBONES = [
    # (wrapped backbone config, conditioned submodule, token layout, odd input size)
    (dict(type='mmpretrain.VisionTransformer', arch='deit-tiny', img_size=64, patch_size=16), 'patch_embed',
     'auto', (80, 112)),
    (dict(type='mmpretrain.SwinTransformer', arch=SMALL_HIERARCHY, img_size=64, pad_small_map=True), 'patch_embed',
     'auto', (97, 131)),
    (dict(type='mmpretrain.XCiT', patch_size=16, embed_dims=64, depth=2, num_heads=4, out_type='featmap',
          out_indices=(1, )), 'patch_embed', 'auto', (70, 90)),
    (dict(type='mmpretrain.DaViT', arch=SMALL_HIERARCHY, out_indices=(0, 3)), 'patch_embed', 'auto', (224, 256)),
    (dict(type='mmdet.ResNet', depth=18, out_indices=(0, 1, 2, 3)), 'conv1', 'BCHW', (75, 99)),
]
IDS = ['vit', 'swin', 'xcit', 'davit', 'resnet']


def build(cfg, **kwargs):
    init_default_scope('mmdet')
    return MODELS.build(dict(type='CondTokBackbone', backbone=cfg, **kwargs))


def output_of(module, name):
    seen = {}
    target = dict(module.named_modules())[name]
    target.register_forward_hook(lambda m, a, out: seen.__setitem__('out', out[0] if isinstance(out, tuple)
                                                                    else out))
    return seen


def as_matrix(tokens):
    return tokens.flatten(2).transpose(1, 2) if tokens.dim() == 4 else tokens


@pytest.mark.parametrize('cfg, target, layout, size', BACKBONES, ids=IDS)
@pytest.mark.slow
def test_wrapped_backbone_keys_outputs_and_conditioning(cfg, target, layout, size):
    torch.manual_seed(0)
    init_default_scope('mmdet')
    plain = MODELS.build(cfg)
    plain.eval()
    off = build(cfg, conditioning=None, targets=(target, ))
    on = build(cfg, targets=(target, ), token_layout=layout)
    for wrapper in (off, on):
        assert list(wrapper.state_dict()) == list(plain.state_dict())  # no key remapping
        wrapper.load_state_dict(plain.state_dict(), strict=True)
        wrapper.eval()
    x = torch.randn(2, 3, *size)
    seen = output_of(on.wrapped, target)
    with torch.no_grad():
        expected, unconditioned, conditioned = plain(x), off(x), on(x)
    for a, b in zip(expected, unconditioned):
        assert torch.equal(a, b)
    assert [o.shape for o in conditioned] == [o.shape for o in expected]
    assert (condition_number(as_matrix(seen['out'])) <= 2 + 1e-3).all()
    assert any(not torch.allclose(a, b) for a, b in zip(expected, conditioned))


VITDET = dict(type='ViTDetViT', img_size=128, patch_size=16, embed_dim=32, depth=2, num_heads=2, window_size=4,
              window_block_indexes=(0, ), use_rel_pos=True)


def test_auto_layout_reads_vitdets_channel_last_patch_embedding_and_bounds_its_token_matrices():
    torch.manual_seed(0)
    wrapper = build(VITDET)  # token_layout='auto', the README's example
    seen = output_of(wrapper.wrapped, 'patch_embed')
    with torch.no_grad():
        wrapper(torch.randn(2, 3, 128, 160))
    tokens = seen['out']
    assert tokens.shape == (2, 8, 10, 32)  # (B, H, W, C)
    assert (condition_number(tokens.flatten(1, 2).double()) <= 2 * (1 + 1e-4)).all()


def test_auto_layout_refuses_a_4d_output_it_cannot_read_naming_the_layouts():
    wrapper = build(dict(type='mmdet.ResNet', depth=18, out_indices=(0, )), targets=('layer1', ))
    with pytest.raises(ValueError, match=r"token_layout='auto' cannot tell whether the ResLayer output of shape "
                       r"\(1, 64, 16, 16\) is \(B, C, H, W\) or \(B, H, W, C\); give token_layout='BCHW' or 'BHWC'"):
        wrapper(torch.randn(1, 3, 64, 64))
    conv = build(dict(type='mmdet.ResNet', depth=18, out_indices=(0, )), targets=('conv1', ))  # a convolution
    seen = output_of(conv.wrapped, 'conv1')
    with torch.no_grad():
        conv(torch.randn(1, 3, 64, 64))
    assert (condition_number(as_matrix(seen['out']).double()) <= 2 * (1 + 1e-4)).all()  # read as (B, C, H, W)


@pytest.mark.slow
def test_pretrained_weights_load_through_the_wrapped_init_cfg(tmp_path):
    cfg = BACKBONES[0][0]
    init_default_scope('mmdet')
    source = MODELS.build(cfg)
    path = tmp_path / 'vit.pth'
    torch.save({'state_dict': source.state_dict()}, path)
    wrapper = build(dict(cfg, init_cfg=dict(type='Pretrained', checkpoint=str(path))))
    wrapper.init_weights()
    for key, value in source.state_dict().items():
        assert torch.equal(wrapper.state_dict()[key], value), key


def test_non_finite_tokens_raise_naming_the_wrapped_backbone_and_target():
    wrapper = build(BACKBONES[0][0])  # mmpretrain's ViT, 192 channels, conditioned at its patch embedding
    x = torch.randn(1, 3, 64, 64)
    x[0, 2, 33, 7] = float('nan')  # one pixel: one patch token, all 192 channels
    with pytest.raises(ValueError, match=r'^CondTokBackbone\(VisionTransformer\)\.patch_embed: the token matrix '
                                         'has 192 non-finite'):
        wrapper(x)


def test_detector_checkpoint_loads_like_load_from():
    # a detector whose backbone is wrapped loads the plain detector's state dict as it is
    backbone = BACKBONES[-1][0]
    plain, wrapped = nn.Module(), nn.Module()
    init_default_scope('mmdet')
    plain.backbone = MODELS.build(backbone)
    wrapped.backbone = build(backbone, targets=('conv1', ))
    state = plain.state_dict()
    assert all(k.startswith('backbone.') for k in state)
    result = wrapped.load_state_dict(state, strict=True)
    assert result.missing_keys == [] and result.unexpected_keys == []
    assert wrapped.state_dict().keys() == state.keys()


def test_unknown_target_and_bad_layout_are_explained():
    cfg = BACKBONES[0][0]
    with pytest.raises(ValueError, match=r"no submodule named 'patch_embd'; its top-level submodules are "
                                         r'patch_embed, drop_after_pos, .*layers'):
        build(cfg, targets=('patch_embd', ))
    with pytest.raises(ValueError, match="token_layout='NCHW' is invalid; use one of 'auto', 'BNC', 'BHWC', 'BCHW'$"):
        build(cfg, token_layout='NCHW')
    wrapper = build(cfg, token_layout='BHWC')
    with pytest.raises(ValueError, match=r"token_layout='BHWC' does not fit a tensor of shape \(1, 16, 192\)"):
        wrapper(torch.randn(1, 3, 64, 64))


def test_cond_tok_neck_conditions_each_level_before_fpn():
    torch.manual_seed(0)
    fpn = dict(type='mmdet.FPN', in_channels=[8, 16, 32], out_channels=8, num_outs=3)
    init_default_scope('mmdet')
    plain = MODELS.build(fpn)
    off = MODELS.build(dict(type='CondTokNeck', neck=fpn, conditioning=None))
    on = MODELS.build(dict(type='CondTokNeck', neck=fpn, levels=(0, 2)))
    for neck in (off, on):
        assert list(neck.state_dict()) == list(plain.state_dict())
        neck.load_state_dict(plain.state_dict(), strict=True)
    inputs = tuple(torch.randn(2, c, s, s) for c, s in ((8, 16), (16, 8), (32, 4)))
    seen = {}
    for i, conv in enumerate(on.wrapped.lateral_convs):
        conv.register_forward_pre_hook(lambda m, a, i=i: seen.__setitem__(i, a[0]))
    for a, b in zip(plain(inputs), off(inputs)):
        assert torch.equal(a, b)
    on(inputs)
    assert (condition_number(as_matrix(seen[0])) <= 2 + 1e-3).all()
    assert (condition_number(as_matrix(seen[2])) <= 2 + 1e-3).all()
    assert torch.equal(seen[1], inputs[1])  # level 1 not chosen
    with pytest.raises(ValueError, match=r'levels \[5\] do not exist; the neck gets 3 levels'):
        MODELS.build(dict(type='CondTokNeck', neck=fpn, levels=(5, )))(inputs)


@pytest.mark.slow
def test_mmpretrain_classifier_from_our_config_trains_a_step():
    # the conditioned ViT-B classification config, shrunk to a tiny ViT, built by mmpretrain's registry
    from mmpretrain.registry import MODELS as MMPRETRAIN_MODELS
    from mmpretrain.structures import DataSample
    from mmengine.optim import OptimWrapper
    cfg = Config.fromfile(f'{REPO_ROOT}/configs/classification/vit-base-p16-condtok_64xb64_in1k.py')
    assert cfg.default_scope == 'mmpretrain'
    cfg.model.backbone.backbone.update(arch='deit-tiny', img_size=32, patch_size=8)
    cfg.model.head.update(in_channels=192, num_classes=4)
    cfg.model.train_cfg = None  # no Mixup/CutMix for 2 images
    init_default_scope('mmpretrain')
    model = MMPRETRAIN_MODELS.build(cfg.model)
    assert type(model.backbone).__name__ == 'CondTokBackbone'
    optim = OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1))
    batch = dict(inputs=[torch.randint(0, 255, (3, 32, 32), dtype=torch.uint8) for _ in range(2)],
                 data_samples=[DataSample().set_gt_label(label) for label in (1, 3)])
    before = model.backbone.wrapped.patch_embed.projection.weight.clone()
    losses = model.train_step(batch, optim)
    assert torch.isfinite(losses['loss'])
    assert not torch.equal(before, model.backbone.wrapped.patch_embed.projection.weight)


def test_cond_swin_builds_by_bare_name_in_mmpretrain():
    from mmpretrain.registry import MODELS as MMPRETRAIN_MODELS
    init_default_scope('mmpretrain')
    backbone = MMPRETRAIN_MODELS.build(ConfigDict(type='CondSwinTransformer', embed_dims=32,
                                                  depths=(1, 1, 1, 1), num_heads=(1, 2, 4, 8)))
    assert type(backbone).__name__ == 'CondSwinTransformer'


@pytest.mark.parametrize('cfg, target, layout, size, to_grid', [
    # mmdet's Swin: the patch embedding returns (tokens, hw_shape)
    (dict(type='mmdet.SwinTransformer', embed_dims=32, depths=(1, 1, 1, 1), num_heads=(1, 2, 4, 8)),
     'patch_embed', 'auto', (62, 94), lambda out, hw: out.view(out.shape[0], *hw, -1)),
    # ResNet's stem: a (B, C, H, W) map
    (dict(type='mmdet.ResNet', depth=18, out_indices=(0, )), 'conv1', 'BCHW', (61, 93),
     lambda out, hw: out.permute(0, 2, 3, 1)),
], ids=['swin-hw-shape', 'resnet-bchw'])
def test_window_scope_conditions_each_window_where_the_grid_is_known(cfg, target, layout, size, to_grid):
    torch.manual_seed(0)
    window = dict(type='TokenConditioner', scope='window', window_size=5)
    wrapper = build(cfg, targets=(target, ), token_layout=layout, conditioning=window)
    wrapper.eval()
    seen = {}
    dict(wrapper.wrapped.named_modules())[target].register_forward_hook(
        lambda m, a, out: seen.update(out=out[0], hw=out[1]) if isinstance(out, tuple) else seen.update(out=out))
    with torch.no_grad():
        wrapper(torch.randn(2, 3, *size))
    grid = to_grid(seen['out'], seen.get('hw'))
    assert grid.shape[1] % 5 and grid.shape[2] % 5  # border windows cut by the edge are included
    for (top, left), window in window_matrices(grid, 5).items():
        assert (condition_number(window) <= 2 + 1e-3).all(), (top, left)
    assert condition_number(grid.reshape(2, -1, grid.shape[-1])).max() > 2.5  # not one image-wide matrix


def test_window_scope_without_a_token_grid_is_explained():
    window = dict(type='TokenConditioner', scope='window', window_size=4)
    vit = build(dict(type='mmpretrain.VisionTransformer', arch='deit-tiny', img_size=64, patch_size=16),
                targets=('drop_after_pos', ), conditioning=window)
    with pytest.raises(ValueError, match=r"scope='window' needs the token grid, and \(B, N, C\) tokens "
                                         r'\(1, 17, 192\) come without an \(H, W\)'):
        vit(torch.randn(1, 3, 64, 64))
    fpn = dict(type='mmdet.FPN', in_channels=[8], out_channels=8, num_outs=1)
    with pytest.raises(ValueError, match=r"CondTokNeck\(FPN\): scope='window' needs the token grid"):
        MODELS.build(dict(type='CondTokNeck', neck=fpn, token_layout='BNC', conditioning=window))
