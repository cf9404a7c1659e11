"""SpectralAttentionBackbone: W_Q, W_K, W_V + lambda I, against attention written out by hand in float64."""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from mmengine.config import ConfigDict
from mmengine.registry import init_default_scope

import condtok_mm  # noqa: F401
from condtok_mm.registry import MODELS
from condtok_mm.models.layout import attention_projections

LAM = 10.0
SWIN = dict(type='SwinTransformer', embed_dims=32, depths=[1, 1, 2, 1], num_heads=[1, 2, 4, 8], window_size=4,
            convert_weights=False, init_cfg=None)
VITDET = dict(type='ViTDetViT', img_size=64, embed_dim=48, depth=2, num_heads=3, window_size=4,
              window_block_indexes=[0], pretrain_img_size=64, init_cfg=None)
XCIT = dict(type='mmpretrain.XCiT', patch_size=16, embed_dims=32, depth=2, num_heads=4, out_type='featmap',
            out_indices=(1, ))
VIT = dict(type='mmpretrain.VisionTransformer', arch=dict(embed_dims=48, num_layers=2, num_heads=3,
                                                          feedforward_channels=96), img_size=32, patch_size=8)


def build(backbone, **kwargs):
    init_default_scope('mmdet')
    torch.manual_seed(0)
    model = MODELS.build(dict(type='SpectralAttentionBackbone', backbone=backbone, **kwargs)).double()
    model.eval()
    return model


def build_plain(cfg):
    init_default_scope('mmdet')
    model = MODELS.build(cfg).double()
    model.eval()  # mmdet's SwinTransformer.train returns None
    return model


def randomize(module):
    """Weights far from their init (biases included), so that no term of the reference can hide."""
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.copy_(0.3 * torch.randn(parameter.shape, dtype=parameter.dtype, generator=gen))


def shifted_heads(qkv, x, heads, lam):
    """q, k, v of shape (B, heads, N, head_dim), each head from its own block W^h + lam [0 .. I .. 0] of W_q,
    W_k, W_v, written out per head in float64 (not through the implementation's fused [x; x; x])."""
    batch, tokens, channels = x.shape
    head_dim = channels // heads
    weight = qkv.weight.double()
    bias = qkv.bias.double() if qkv.bias is not None else torch.zeros(3 * channels, dtype=torch.float64)
    eye = torch.eye(channels, dtype=torch.float64)
    parts = []
    for block in range(3):  # q, k, v
        per_head = []
        for head in range(heads):
            rows = slice(block * channels + head * head_dim, block * channels + (head + 1) * head_dim)
            w_head = weight[rows] + lam * eye[head * head_dim:(head + 1) * head_dim]  # (head_dim, channels)
            per_head.append(x @ w_head.T + bias[rows])
        parts.append(torch.stack(per_head, dim=1))
    return parts


def softmax_attention_reference(attention, x, heads, lam, scale, logit_bias=0.0):
    q, k, v = shifted_heads(attention.qkv, x, heads, lam)
    weights = torch.softmax(scale * q @ k.transpose(-1, -2) + logit_bias, dim=-1)
    out = (weights @ v).transpose(1, 2).reshape(x.shape)
    return out @ attention.proj.weight.T + attention.proj.bias


@pytest.mark.parametrize('lam', [LAM, 0.5])
def test_mmdet_swin_window_msa_matches_the_reference(lam):
    backbone = build(SWIN, lam=lam)
    randomize(backbone)
    attention = backbone.wrapped.stages[2].blocks[0].attn.w_msa  # 4 heads
    x = torch.randn(3, 16, 128, dtype=torch.float64)
    bias = attention.relative_position_bias_table[attention.relative_position_index.view(-1)].view(16, 16, -1)
    want = softmax_attention_reference(attention, x, 4, lam, attention.scale, bias.permute(2, 0, 1))
    torch.testing.assert_close(attention(x), want, rtol=1e-10, atol=1e-10)


def test_vitdet_attention_matches_the_reference():
    backbone = build(dict(VITDET, use_rel_pos=False))  # the relative position bias is no part of the shift
    randomize(backbone)
    attention = backbone.wrapped.blocks[1].attn  # 3 heads, global
    x = torch.randn(2, 5, 6, 48, dtype=torch.float64)
    want = softmax_attention_reference(attention, x.reshape(2, 30, 48), 3, LAM, attention.scale)
    torch.testing.assert_close(attention(x).reshape(2, 30, 48), want, rtol=1e-10, atol=1e-10)


def test_cond_vit_attention_is_shifted_too():
    backbone = build(dict(VITDET, type='CondViT'))
    assert backbone.projections == ['blocks.0.attn.qkv', 'blocks.1.attn.qkv']


def test_mmpretrain_multihead_attention_matches_the_reference():
    backbone = build(VIT)
    randomize(backbone)
    attention = backbone.wrapped.layers[1].attn
    x = torch.randn(2, 17, 48, dtype=torch.float64)
    want = softmax_attention_reference(attention, x, 3, LAM, 16**-0.5)
    torch.testing.assert_close(attention(x), want, rtol=1e-10, atol=1e-10)


def test_mmpretrain_xcit_cross_covariance_attention_matches_the_reference():
    backbone = build(XCIT)
    randomize(backbone)
    attention = backbone.wrapped.xca_layers[0].attn  # XCA: attention over channels, per head
    x = torch.randn(2, 12, 32, dtype=torch.float64)
    q, k, v = (t.transpose(-1, -2) for t in shifted_heads(attention.qkv, x, 4, LAM))  # (B, heads, hd, N)
    logits = F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-1, -2) * attention.temperature
    out = (torch.softmax(logits, dim=-1) @ v).permute(0, 3, 1, 2).reshape(2, 12, 32)
    want = out @ attention.proj.weight.T + attention.proj.bias
    torch.testing.assert_close(attention(x), want, rtol=1e-10, atol=1e-10)
    # XCiT's class-attention blocks hold q, k, v as separate Linears: each gets its own lambda I
    names = backbone.projections
    assert 'xca_layers.0.attn.qkv' in names and {'ca_layers.0.attn.q', 'ca_layers.0.attn.k',
                                                 'ca_layers.0.attn.v'} <= set(names)


def folded(plain, lam):
    """A copy of ``plain`` with lambda I written into every qkv weight: what the shift must compute."""
    model = copy.deepcopy(plain)
    for module in model.modules():
        if isinstance(getattr(module, 'qkv', None), nn.Linear):
            channels = module.qkv.in_features
            with torch.no_grad():
                module.qkv.weight += lam * torch.eye(channels, dtype=torch.float64).repeat(3, 1)
    return model


@pytest.mark.parametrize('cfg, size', [(SWIN, (64, 96)), (VITDET, (64, 64))], ids=['swin', 'vitdet'])
def test_whole_backbone_equals_the_plain_one_with_lambda_folded_into_its_weights(cfg, size):
    backbone = build(cfg)
    randomize(backbone)
    plain = build_plain(cfg)
    plain.load_state_dict(backbone.state_dict())
    x = torch.randn(2, 3, *size, dtype=torch.float64)
    for got, want in zip(backbone(x), folded(plain, LAM)(x)):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)
    assert not torch.allclose(backbone(x)[-1], plain(x)[-1])  # the shift is not nothing


@pytest.mark.slow
def test_lambda_zero_is_the_plain_backbone():
    backbone = build(SWIN, lam=0)
    randomize(backbone)
    plain = build_plain(SWIN)
    plain.load_state_dict(backbone.state_dict())
    x = torch.randn(2, 3, 64, 64, dtype=torch.float64)
    for got, want in zip(backbone(x), plain(x)):
        assert torch.equal(got, want)


@pytest.mark.slow
def test_state_dict_is_the_raw_weights_and_a_plain_checkpoint_loads_unchanged(tmp_path):
    plain = build_plain(SWIN)
    randomize(plain)
    checkpoint = tmp_path / 'plain.pth'
    # a detector checkpoint trained without the shift (mmdet's Swin loads the 'backbone.' keys of one)
    torch.save({'state_dict': {f'backbone.{k}': v for k, v in plain.state_dict().items()}}, checkpoint)
    pretrained = dict(SWIN, init_cfg=ConfigDict(type='Pretrained', checkpoint=str(checkpoint)))
    backbone = build(pretrained)
    backbone.init_weights()  # mmengine's Pretrained init, as a detector's init_weights does
    ours, theirs = backbone.state_dict(), plain.state_dict()
    assert list(ours) == list(theirs)  # no extra keys, no 'wrapped.' prefix
    for key in theirs:
        assert torch.equal(ours[key], theirs[key]), key
    backbone(torch.randn(1, 3, 64, 64, dtype=torch.float64))  # a forward leaves the weights as they are
    assert all(torch.equal(backbone.state_dict()[key], theirs[key]) for key in theirs)
    # and what it saves loads strictly into the plain backbone, and back into a spectral one
    plain.load_state_dict(backbone.state_dict(), strict=True)
    build(SWIN).load_state_dict(backbone.state_dict(), strict=True)


@pytest.mark.slow
def test_a_deep_copy_shifts_with_its_own_lambda():
    backbone = build(SWIN)
    twin = copy.deepcopy(backbone)  # e.g. an EMA model
    x = torch.randn(1, 3, 64, 64, dtype=torch.float64)
    torch.testing.assert_close(twin(x)[-1], backbone(x)[-1], rtol=0, atol=0)
    twin.lam = 0.0
    assert not torch.allclose(twin(x)[-1], backbone(x)[-1])
    plain = twin.wrapped
    torch.testing.assert_close(twin(x)[-1], plain(x)[-1], rtol=0, atol=0)


def test_every_window_attention_of_swin_is_found():
    backbone = build(SWIN)
    windows = [name for name, module in backbone.wrapped.named_modules() if type(module).__name__ == 'WindowMSA']
    assert backbone.projections == [f'{name}.qkv' for name in windows] and len(windows) == 5
    assert repr(backbone).count('lam=10.0, 5 projections') == 1


def test_targets_restrict_the_shift_to_the_named_attention_modules():
    backbone = build(VITDET, targets=['blocks.1.attn'])
    assert backbone.projections == ['blocks.1.attn.qkv']
    with pytest.raises(ValueError, match=r"'blocks.7.attn' is not an attention module .* the attention modules "
                                         r"are 'blocks.0.attn', 'blocks.1.attn'"):
        build(VITDET, targets=['blocks.7.attn'])


def test_a_backbone_without_attention_is_refused():
    with pytest.raises(ValueError, match=r'SpectralAttentionBackbone\(ResNet\): found no attention module'):
        build(dict(type='ResNet', depth=18))


def test_a_projection_without_square_blocks_is_refused():
    attention = nn.Module()
    attention.qkv = nn.Linear(8, 30)
    model = nn.Sequential(attention)
    with pytest.raises(ValueError, match=r'0.qkv maps 8 -> 30 channels, not 3 x 8: .* not square.*`targets`'):
        attention_projections(model)
    attention.qkv = nn.Linear(8, 24)
    assert [name for name, _ in attention_projections(model)] == ['0.qkv']


@pytest.mark.parametrize('lam', [-1, float('inf'), True, '10'])
def test_invalid_lambda_is_refused(lam):
    with pytest.raises(ValueError, match=r'SpectralAttentionBackbone: lam=.* is invalid; use a finite number >= 0'):
        build(SWIN, lam=lam)
