import pytest
import torch
from mmengine.config import ConfigDict
from mmdet.models.backbones import SwinTransformer
from mmdet.models.backbones.swin import swin_converter

import condtok_mm  # noqa: F401
from condtok_mm.conditioning import condition_number, condition_token_windows, condition_tokens
from condtok_mm.registry import MODELS
from helpers.tokens import window_matrices

SMALL = dict(embed_dims=32, depths=(1, 1, 2, 1), num_heads=(1, 2, 4, 8), window_size=4)


def build(**kwargs):
    return MODELS.build(dict(type='CondSwinTransformer', **SMALL, **kwargs))


def capture_stage_inputs(model):
    """Record the tokens each stage receives (after any conditioning)."""
    seen = {}
    for i, stage in enumerate(model.stages):
        stage.register_forward_pre_hook(lambda m, args, i=i: seen.__setitem__(i, args[0].detach()))
    return seen


def test_builds_by_bare_name_in_mmdet_config():
    from mmdet.registry import MODELS as MMDET_MODELS
    model = MMDET_MODELS.build(dict(type='CondSwinTransformer', **SMALL))
    assert isinstance(model, SwinTransformer) and model.condition_stages == (0, )


@pytest.mark.parametrize('size', [(32, 32), (67, 45), (96, 128)])
def test_conditioning_off_equals_swin_transformer(size):
    torch.manual_seed(0)
    reference = SwinTransformer(**SMALL)
    ours = build(conditioning=None)
    ours.load_state_dict(reference.state_dict(), strict=True)
    reference.eval()  # SwinTransformer.train() returns None, so no chaining
    ours.eval()
    x = torch.randn(2, 3, *size)
    with torch.no_grad():
        for a, b in zip(reference(x), ours(x)):
            assert torch.equal(a, b)


def test_state_dict_keys_equal_swin_transformer():
    reference = SwinTransformer(**SMALL)
    ours = build(condition_stages=(0, 1, 2, 3))
    assert list(ours.state_dict().keys()) == list(reference.state_dict().keys())
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in reference.parameters())


@pytest.mark.parametrize('layout', ['mmdet', 'original'])
def test_loads_swin_checkpoint_through_init_cfg(tmp_path, layout):
    torch.manual_seed(0)
    source = SwinTransformer(**SMALL)
    with torch.no_grad():  # norms start at 1 and 0: random values everywhere, so that every key must load
        for parameter in source.parameters():
            parameter.normal_()
    state = {f'backbone.{k}': v for k, v in source.state_dict().items()}
    convert = False
    if layout == 'original':  # the official Swin release layout, converted by swin_converter on load
        state = _to_original_layout(source.state_dict())
        assert swin_converter(state).keys() == {f'backbone.{k}' for k in source.state_dict()}
        convert = True
    path = tmp_path / 'swin.pth'
    torch.save({'state_dict': state} if layout == 'mmdet' else {'model': state}, path)
    # as built from a config file: SwinTransformer.init_weights reads init_cfg by attribute
    torch.manual_seed(1)
    model = build(convert_weights=convert, init_cfg=ConfigDict(type='Pretrained', checkpoint=str(path)))
    learned = [k for k, v in source.state_dict().items() if not torch.equal(model.state_dict()[k], v)]
    assert len(learned) == len(list(source.parameters()))  # every parameter differs before loading
    model.init_weights()  # the Pretrained path of SwinTransformer.init_weights: the only load here
    assert model.state_dict().keys() == source.state_dict().keys()
    for key, value in source.state_dict().items():
        assert torch.equal(model.state_dict()[key], value), key


def _to_original_layout(state):
    """Invert swin_converter for the keys a small model has (reduction/norm orders included)."""
    original = {}
    for k, v in state.items():
        if k.startswith('stages'):
            new_k = k.replace('stages', 'layers', 1)
            if 'attn.w_msa.' in k:
                new_k = new_k.replace('attn.w_msa.', 'attn.')
            elif 'ffn.layers.0.0.' in k:
                new_k = new_k.replace('ffn.layers.0.0.', 'mlp.fc1.')
            elif 'ffn.layers.1.' in k:
                new_k = new_k.replace('ffn.layers.1.', 'mlp.fc2.')
            elif 'downsample.reduction' in k:
                out_c, in_c = v.shape
                v = v.reshape(out_c, in_c // 4, 4)[:, :, [0, 2, 1, 3]].transpose(1, 2).reshape(out_c, in_c)
            elif 'downsample.norm' in k:
                v = v.reshape(v.shape[0] // 4, 4)[:, [0, 2, 1, 3]].transpose(0, 1).reshape(-1)
            original[new_k] = v
        elif k.startswith('patch_embed'):
            original[k.replace('projection', 'proj')] = v
        else:
            original[k] = v
    return original


def swin_conditioned_at(model, stages, **conditioning):
    """mmdet's SwinTransformer with ``model``'s weights, whose stage inputs in ``stages`` (0: the patch
    embedding's output) go through condition_tokens by hooks: what CondSwinTransformer should compute."""
    reference = SwinTransformer(**SMALL)
    reference.load_state_dict(model.state_dict(), strict=True)
    reference.eval()
    def on_grid(tokens, hw_shape):  # each image's tokens as its (H, W) grid, as the backbone passes them
        return condition_tokens(tokens.view(tokens.shape[0], *hw_shape, -1), **conditioning).view(tokens.shape)

    if 0 in stages:
        reference.patch_embed.register_forward_hook(lambda m, args, out: (on_grid(*out), out[1]))
    for stage in set(stages) - {0}:
        reference.stages[stage].register_forward_pre_hook(lambda m, args: (on_grid(*args), args[1]))
    return reference


@pytest.mark.parametrize('mode', ['sigma_max', 'floor'])
def test_patch_tokens_are_conditioned_before_the_first_stage(mode):
    torch.manual_seed(0)
    model = build(conditioning=dict(type='TokenConditioner', mode=mode))
    model.eval()
    seen = capture_stage_inputs(model)
    x = torch.randn(2, 3, 128, 96)
    with torch.no_grad():
        raw, _ = model.patch_embed(x)
        outs = model(x)
        reference = swin_conditioned_at(model, (0, ), mode=mode)
        expected_seen = capture_stage_inputs(reference)
        expected = reference(x)
    # LayerNorm'd patch tokens: every token has zero mean over channels, so X 1 = 0
    assert torch.allclose(raw.mean(-1), torch.zeros(()), atol=1e-5)
    assert (condition_number(raw) > 1e4).all()
    assert (condition_number(seen[0]) <= 2 + 1e-3).all()
    # the later stages are untouched: bit for bit what SwinTransformer computes from the conditioned tokens
    for stage in range(4):
        assert torch.equal(seen[stage], expected_seen[stage]), stage
    for ours, theirs in zip(outs, expected):
        assert torch.equal(ours, theirs)


def test_condition_later_stages():
    torch.manual_seed(0)
    model = build(condition_stages=(0, 2))
    model.eval()
    seen = capture_stage_inputs(model)
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        outs = model(x)
        reference = swin_conditioned_at(model, (0, 2))
        expected_seen = capture_stage_inputs(reference)
        expected = reference(x)
    assert condition_number(seen[2]) <= 2 + 1e-3
    for stage in range(4):  # conditioned at 0 and 2, stages 1 and 3 get what the stage before returns
        assert torch.equal(seen[stage], expected_seen[stage]), stage
    for ours, theirs in zip(outs, expected):
        assert torch.equal(ours, theirs)


@pytest.mark.parametrize('stages, where', [((0, ), 'stage 0'), ((1, ), 'stage 1'), ((0, 3), 'stage 0')])
def test_non_finite_tokens_raise_naming_the_stage(stages, where):
    model = build(condition_stages=stages)
    x = torch.randn(1, 3, 64, 64)
    x[0, 1, 10, 20] = float('nan')  # one pixel: one patch token, all 32 channels after the LayerNorm
    # stage 0's attention spreads it over its 4 x 4 window; patch merging makes those 2 x 2 tokens of 64 channels
    count = 32 if where == 'stage 0' else 2 * 2 * 64
    with pytest.raises(ValueError, match=rf'^CondSwinTransformer {where}: the token matrix has {count} non-finite'):
        model(x)


def test_trains_with_gradients_to_patch_embedding():
    model = build()
    out = model(torch.randn(2, 3, 64, 64))
    sum(o.mean() for o in out).backward()
    assert model.patch_embed.projection.weight.grad is not None
    assert torch.isfinite(model.patch_embed.projection.weight.grad).all()


def test_per_window_conditioning_uses_the_first_blocks_windows():
    model = build(conditioning=dict(type='TokenConditioner', scope='window'), condition_stages=(0, 1))
    assert (model.conditioners['0'].window_size, model.conditioners['0'].shift_size) == (4, 0)
    model.eval()
    seen = capture_stage_inputs(model)
    with torch.no_grad():
        model(torch.randn(2, 3, 72, 100))  # 18 x 25 tokens: windows cut by the border at the bottom/right
    for stage, (height, width) in ((0, (18, 25)), (1, (9, 13))):
        for (top, left), window in window_matrices(seen[stage].view(2, height, width, -1), 4).items():
            assert (condition_number(window) <= 2 + 1e-3).all(), (stage, top, left)


@pytest.mark.parametrize('window, message', [
    (dict(window_size=7), 'window_size=7, shift_size=0 but the attention block it feeds uses window_size=4, '
     'shift_size=0'),
    (dict(shift_size=2), "shift_size=2 but .* uses window_size=4, shift_size=0; leave window_size and "
     'shift_size out'),
])
def test_per_window_conditioning_must_match_the_attention_windows(window, message):
    with pytest.raises(ValueError, match=f'CondSwinTransformer stage 0: per-window conditioning uses .*{message}'):
        build(conditioning=dict(type='TokenConditioner', scope='window', **window))


@pytest.mark.parametrize('scope', ['image', 'window'])
def test_attention_input_position_conditions_norm1_output_and_leaves_the_stream(scope):
    torch.manual_seed(0)
    conditioned = build(conditioning=dict(type='TokenConditioner', position='attention_input', scope=scope))
    plain = MODELS.build(dict(type='CondSwinTransformer', **SMALL, conditioning=None))
    plain.load_state_dict(conditioned.state_dict())
    seen = {}
    for name, model in (('plain', plain), ('conditioned', conditioned)):
        model.stages[0].register_forward_pre_hook(lambda m, a, name=name: seen.__setitem__(name + '_in', a[0]))
        model.stages[0].blocks[0].norm1.register_forward_hook(
            lambda m, a, out, name=name: seen.__setitem__(name + '_norm1', out.detach()))
    x = torch.randn(2, 3, 64, 72)  # a 16 x 18 grid: border windows are cut
    with torch.no_grad():
        plain(x), conditioned(x)
    assert torch.equal(seen['plain_in'], seen['conditioned_in'])  # the residual stream is untouched
    want = (condition_tokens(seen['plain_norm1'].view(2, 16, 18, 32)).view(2, 288, 32) if scope == 'image' else
            condition_token_windows(seen['plain_norm1'], (16, 18), 4))
    torch.testing.assert_close(seen['conditioned_norm1'], want, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(seen['conditioned_norm1'], seen['plain_norm1'], atol=1e-2)
