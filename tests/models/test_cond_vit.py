import pytest
import torch
import torch.nn.functional as F
from mmengine.config import ConfigDict
from mmengine.registry import MODELS as ROOT_MODELS
from mmdet.registry import MODELS as MMDET_MODELS

import condtok_mm  # noqa: F401
from condtok_mm.conditioning import condition_number, condition_token_windows
from condtok_mm.models.backbones import CondViT, ViTDetViT
from condtok_mm.registry import MODELS
from helpers.tokens import window_matrices

# A depth-2 ViT: block 0 attends in 4 x 4 windows, block 1 globally; relative position bias on.
SMALL = dict(img_size=128, patch_size=16, embed_dim=32, depth=2, num_heads=2, window_size=4,
             window_block_indexes=(0, ), use_rel_pos=True, drop_path_rate=0.1)

# The state dict of mmdet 3.3.0 projects/ViTDet `ViT(**SMALL)`, in order, as read from vit.py: the position
# embedding (224 / 16 = 14, so 14 * 14 + 1 class-token entries), the patch embedding conv, then per block
# norm1, attn (its own rel_pos_h/w parameters before its qkv and proj Linear layers), norm2 and the MLP.
# The relative position tables have 2 * size - 1 rows: size 4 (the window) in block 0, 128 / 16 = 8 in the
# global block 1.
VITDET_KEYS = [('pos_embed', (1, 197, 32)), ('patch_embed.proj.weight', (32, 3, 16, 16)),
               ('patch_embed.proj.bias', (32, ))]
for _block, _rel in ((0, 7), (1, 15)):
    VITDET_KEYS += [(f'blocks.{_block}.{name}', shape) for name, shape in [
        ('norm1.weight', (32, )), ('norm1.bias', (32, )), ('attn.rel_pos_h', (_rel, 16)),
        ('attn.rel_pos_w', (_rel, 16)), ('attn.qkv.weight', (96, 32)), ('attn.qkv.bias', (96, )),
        ('attn.proj.weight', (32, 32)), ('attn.proj.bias', (32, )), ('norm2.weight', (32, )),
        ('norm2.bias', (32, )), ('mlp.fc1.weight', (128, 32)), ('mlp.fc1.bias', (128, )),
        ('mlp.fc2.weight', (32, 128)), ('mlp.fc2.bias', (32, ))]]


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)


def build(**kwargs):
    model = MODELS.build(dict(type='CondViT', **{**SMALL, **kwargs}))
    model.init_weights()
    return model


def randomize(model, seed=0):
    """Non-trivial values everywhere (relative position tables and biases start at zero)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * 0.2 + (1 if p.dim() == 1 else 0))
    return model


def attention_reference(h, p, prefix, num_heads):
    """Self-attention of one (B, gh, gw, C) grid, written from ViTDet's description: the bias of query i and
    key j is q_i . R_h[y_i - y_j] + q_i . R_w[x_i - x_j], gathered for every pair (no decomposition)."""
    batch, grid_h, grid_w, channels = h.shape
    tokens = h.reshape(batch, grid_h * grid_w, channels)
    qkv = F.linear(tokens, p[f'{prefix}.qkv.weight'], p[f'{prefix}.qkv.bias'])
    q, k, v = (t.reshape(batch, -1, num_heads, channels // num_heads).transpose(1, 2)
               for t in qkv.chunk(3, dim=-1))
    logits = q @ k.transpose(-1, -2) * (channels // num_heads)**-0.5
    y, x = (c.flatten() for c in torch.meshgrid(torch.arange(grid_h), torch.arange(grid_w), indexing='ij'))
    for axis, coords, size in (('h', y, grid_h), ('w', x, grid_w)):
        table = p[f'{prefix}.rel_pos_{axis}']
        if table.shape[0] != 2 * size - 1:
            table = F.interpolate(table.t()[None], size=2 * size - 1, mode='linear')[0].t()
        pair_table = table[coords[:, None] - coords[None, :] + size - 1]  # (N, N, head_dim)
        logits = logits + torch.einsum('bhid,ijd->bhij', q, pair_table)
    out = (logits.softmax(-1) @ v).transpose(1, 2).reshape(batch, grid_h, grid_w, channels)
    return F.linear(out, p[f'{prefix}.proj.weight'], p[f'{prefix}.proj.bias'])


def vitdet_reference(p, x, cfg):
    """ViTDet's ViT forward (eval mode) from its description, on a state dict ``p``; windows one by one."""
    patch, channels = cfg['patch_size'], cfg['embed_dim']
    grid = F.conv2d(x, p['patch_embed.proj.weight'], p['patch_embed.proj.bias'], stride=patch)
    height, width = grid.shape[-2:]
    pos = p['pos_embed'][0, 1:].t().reshape(1, channels, 14, 14)  # drop the class token; 224 / 16 = 14
    h = (grid + F.interpolate(pos, size=(height, width), mode='bicubic', align_corners=False))
    h = h.permute(0, 2, 3, 1)
    for i in range(cfg['depth']):
        pre = f'blocks.{i}'
        normed = F.layer_norm(h, (channels, ), p[f'{pre}.norm1.weight'], p[f'{pre}.norm1.bias'], 1e-6)
        if i in cfg['window_block_indexes']:
            size = cfg['window_size']
            padded = F.pad(normed, (0, 0, 0, -width % size, 0, -height % size))
            attended = torch.zeros_like(padded)
            for top in range(0, padded.shape[1], size):
                for left in range(0, padded.shape[2], size):
                    attended[:, top:top + size, left:left + size] = attention_reference(
                        padded[:, top:top + size, left:left + size], p, f'{pre}.attn', cfg['num_heads'])
            attended = attended[:, :height, :width]
        else:
            attended = attention_reference(normed, p, f'{pre}.attn', cfg['num_heads'])
        h = h + attended
        normed = F.layer_norm(h, (channels, ), p[f'{pre}.norm2.weight'], p[f'{pre}.norm2.bias'], 1e-6)
        hidden = F.gelu(F.linear(normed, p[f'{pre}.mlp.fc1.weight'], p[f'{pre}.mlp.fc1.bias']))
        h = h + F.linear(hidden, p[f'{pre}.mlp.fc2.weight'], p[f'{pre}.mlp.fc2.bias'])
    return h.permute(0, 3, 1, 2)


def test_builds_by_bare_name_in_mmdet_config_and_leaves_upstream_names_free():
    assert isinstance(MMDET_MODELS.build(dict(type='CondViT', **SMALL)), ViTDetViT)
    assert type(MMDET_MODELS.build(dict(type='ViTDetViT', **SMALL))) is ViTDetViT
    # a user may import mmdet's projects/ViTDet as well: its names must stay free
    for registry in (ROOT_MODELS, MMDET_MODELS):
        assert not {'ViT', 'SimpleFPN', 'LN2d'} & set(registry.module_dict)


@pytest.mark.parametrize('type_', ['ViTDetViT', 'CondViT'])
def test_state_dict_is_vitdets(type_):
    model = MODELS.build(dict(type=type_, **SMALL))
    assert [(k, tuple(v.shape)) for k, v in model.state_dict().items()] == VITDET_KEYS


def test_loads_a_vitdet_checkpoint_without_missing_or_unexpected_keys(tmp_path):
    source = randomize(MODELS.build(dict(type='ViTDetViT', **SMALL)))
    torch.save({'model': source.state_dict()}, tmp_path / 'vitdet.pth')
    model = build(init_cfg=ConfigDict(type='Pretrained', checkpoint=str(tmp_path / 'vitdet.pth')))
    for key, value in source.state_dict().items():
        torch.testing.assert_close(model.state_dict()[key], value, msg=key)
    result = model.load_state_dict(source.state_dict(), strict=True)
    assert result.missing_keys == [] and result.unexpected_keys == []


def test_loads_mae_weights_dropping_the_class_token_and_final_norm(tmp_path):
    # an MAE ViT: class token, position embedding with its class-token entry, blocks without relative
    # position tables, a final norm
    source = randomize(MODELS.build(dict(type='ViTDetViT', **SMALL)))
    mae = {k: v for k, v in source.state_dict().items() if 'rel_pos' not in k}
    mae.update({'cls_token': torch.randn(1, 1, 32), 'norm.weight': torch.ones(32), 'norm.bias': torch.zeros(32)})
    torch.save({'model': mae}, tmp_path / 'mae.pth')
    model = build(init_cfg=dict(type='Pretrained', checkpoint=str(tmp_path / 'mae.pth')))
    for key, value in model.state_dict().items():
        if 'rel_pos' in key:
            assert torch.equal(value, torch.zeros_like(value)), key
        else:
            torch.testing.assert_close(value, mae[key], msg=key)


def test_rejects_other_init_cfg():
    with pytest.raises(ValueError, match=r"init_cfg must be None or dict\(type='Pretrained'"):
        build(init_cfg=dict(type='Kaiming'))


@pytest.mark.parametrize('size, grid', [((128, 128), (8, 8)), ((100, 150), (6, 9)), ((67, 45), (4, 2))])
def test_conditioning_off_computes_vitdets_forward(size, grid):
    model = randomize(build(conditioning=None)).double().eval()
    x = torch.randn(2, 3, *size, dtype=torch.float64)
    with torch.no_grad():
        out = model(x)
        want = vitdet_reference(model.state_dict(), x, SMALL)
    assert out.shape == (2, 32, *grid)
    torch.testing.assert_close(out, want, rtol=1e-10, atol=1e-10)
    plain = MODELS.build(dict(type='ViTDetViT', **SMALL)).double().eval()
    plain.load_state_dict(model.state_dict())
    with torch.no_grad():
        assert torch.equal(plain(x), out)


def capture(module, store, key, pre=False):
    if pre:
        return module.register_forward_pre_hook(lambda m, args: store.__setitem__(key, args[0].detach()))
    return module.register_forward_hook(lambda m, args, out: store.__setitem__(key, out.detach()))


@pytest.mark.parametrize('mode', ['sigma_max', 'floor'])
def test_conditions_the_patch_embedding_before_the_position_embedding(mode):
    model = build(conditioning=dict(type='TokenConditioner', mode=mode)).eval()
    seen = {}
    capture(model.patch_embed, seen, 'patches')
    capture(model.blocks[0], seen, 'block0', pre=True)
    with torch.no_grad():
        model(torch.randn(2, 3, 96, 112))
    patches = seen['patches'].reshape(2, 6 * 7, 32)
    assert (condition_number(patches) > 2 + 1e-3).all()
    conditioned = seen['block0'] - model.add_abs_pos_embed(torch.zeros(1, 6, 7, 32))
    assert (condition_number(conditioned.reshape(2, 42, 32)) <= 2 + 1e-3).all()


def test_conditions_after_the_position_embedding():
    model = build(condition_after_pos_embed=True).eval()
    assert model.conditioner.where == 'CondViT position embedding'
    seen = {}
    capture(model.blocks[0], seen, 'block0', pre=True)
    with torch.no_grad():
        model(torch.randn(2, 3, 96, 112))
    assert (condition_number(seen['block0'].reshape(2, 42, 32)) <= 2 + 1e-3).all()


def test_per_window_conditioning_conditions_each_window_of_the_first_block():
    model = build(conditioning=dict(type='TokenConditioner', scope='window')).eval()
    assert model.conditioner.window_size == 4
    seen = {}
    capture(model.blocks[0], seen, 'block0', pre=True)
    with torch.no_grad():
        model(torch.randn(2, 3, 176, 112))  # 11 x 7 tokens: windows cut at the bottom and right
    tokens = seen['block0'] - model.add_abs_pos_embed(torch.zeros(1, 11, 7, 32))
    for (top, left), window in window_matrices(tokens, 4).items():
        assert (condition_number(window) <= 2 + 1e-3).all(), (top, left)


@pytest.mark.parametrize('after_pos_embed, where', [(False, 'patch embedding'), (True, 'position embedding')])
def test_non_finite_tokens_raise_naming_where_the_conditioner_sits(after_pos_embed, where):
    model = build(condition_after_pos_embed=after_pos_embed)
    x = torch.randn(1, 3, 64, 64)
    x[0, 0, 5, 40] = float('inf')  # one pixel: one 16 x 16 patch, all 32 channels of its token
    with pytest.raises(ValueError, match=rf'^CondViT {where}: the token matrix has 32 non-finite'):
        model(x)


@pytest.mark.parametrize('kwargs, message', [
    (dict(window_block_indexes=(1, ), conditioning=dict(type='TokenConditioner', scope='window')),
     r"CondViT patch embedding: scope='window' but the attention block it feeds attends globally"),
    (dict(conditioning=dict(type='TokenConditioner', scope='window', window_size=7)),
     'per-window conditioning uses window_size=7, shift_size=0 but the attention block it feeds uses '
     'window_size=4, shift_size=0'),
    (dict(use_abs_pos=False, condition_after_pos_embed=True),
     'condition_after_pos_embed=True but use_abs_pos=False'),
    (dict(condition_after_pos_embed='yes'), "condition_after_pos_embed='yes' is invalid"),
])
def test_invalid_combinations_fail_at_build_time(kwargs, message):
    with pytest.raises(ValueError, match=message):
        build(**kwargs)


def test_attention_probabilities_can_be_recorded_from_the_softmax_module():
    model = build().eval()
    x = torch.randn(1, 3, 96, 112)  # 6 x 7 tokens
    with torch.no_grad():
        before = model(x)
    seen = {}
    capture(model.blocks[0].attn.softmax, seen, 'window')
    capture(model.blocks[1].attn.softmax, seen, 'global')
    with torch.no_grad():
        after = model(x)
    assert torch.equal(before, after)
    assert seen['window'].shape == (4, 2, 16, 16)  # 2 x 2 padded windows of 4 x 4, 2 heads
    assert seen['global'].shape == (1, 2, 42, 42)
    torch.testing.assert_close(seen['global'].sum(-1), torch.ones(1, 2, 42))


@pytest.mark.slow
def test_activation_checkpointing_gives_the_same_output_and_gradients():
    plain = randomize(build(drop_path_rate=0.))
    checkpointed = build(drop_path_rate=0., with_cp=True)
    checkpointed.load_state_dict(plain.state_dict())
    x = torch.randn(2, 3, 96, 80)
    outputs = []
    for model in (plain, checkpointed):
        out = model(x)
        out.square().mean().backward()
        outputs.append((out.detach(), model.patch_embed.proj.weight.grad))
    torch.testing.assert_close(outputs[0][0], outputs[1][0])
    torch.testing.assert_close(outputs[0][1], outputs[1][1])
    assert torch.isfinite(outputs[0][1]).all() and outputs[0][1].abs().sum() > 0


def test_is_a_vitdet_vit_with_one_parameter_free_conditioner():
    model = build()
    assert isinstance(model, CondViT) and isinstance(model, ViTDetViT)
    assert [name for name, _ in model.named_children()] == ['patch_embed', 'blocks', 'conditioner']
    assert list(model.conditioner.parameters()) == []


def test_drop_path_grows_over_the_blocks_and_acts_in_training_only():
    model = build(depth=3, drop_path_rate=0.2, window_block_indexes=(0, 1))
    assert [getattr(b.drop_path, 'drop_prob', 0.) for b in model.blocks] == pytest.approx([0., 0.1, 0.2])
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        model.train()
        assert not torch.equal(model(x), model(x))
        model.eval()
        assert torch.equal(model(x), model(x))


def test_attention_input_position_conditions_the_first_blocks_norm1_output_per_window():
    torch.manual_seed(0)
    conditioned = MODELS.build(dict(type='CondViT', **SMALL, conditioning=dict(
        type='TokenConditioner', position='attention_input', scope='window')))
    plain = MODELS.build(dict(type='ViTDetViT', **SMALL))
    plain.load_state_dict(conditioned.state_dict())
    seen = {}
    for name, model in (('plain', plain), ('conditioned', conditioned)):
        model.blocks[0].norm1.register_forward_hook(
            lambda m, a, out, name=name: seen.__setitem__(name, out.detach()))
    x = torch.randn(1, 3, 96, 112)  # a 6 x 7 grid: border windows are cut
    with torch.no_grad():
        plain(x), conditioned(x)
    tokens = seen['plain'].reshape(1, 6 * 7, 32)
    want = condition_token_windows(tokens, (6, 7), 4).view(1, 6, 7, 32)
    torch.testing.assert_close(seen['conditioned'], want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match='choose one'):
        MODELS.build(dict(type='CondViT', **SMALL, condition_after_pos_embed=True,
                          conditioning=dict(type='TokenConditioner', position='attention_input')))
