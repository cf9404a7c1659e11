"""Where a conditioner acts is one Placement, resolved by one builder for the four owners; an owner that cannot
honour a placement refuses it at build time naming what it supports, instead of conditioning something else."""
import pytest
import torch
from mmengine.registry import init_default_scope

import condtok_mm  # noqa: F401
from condtok_mm.conditioning import condition_number
from condtok_mm.models.placement import Placement
from condtok_mm.registry import MODELS

SWIN = dict(type='mmdet.SwinTransformer', embed_dims=16, depths=(1, 1), num_heads=(1, 2), window_size=4,
            strides=(4, 2), out_indices=(0, 1))
FPN = dict(type='mmdet.FPN', in_channels=[8, 16], out_channels=8, num_outs=2)
ATTENTION_INPUT = dict(type='TokenConditioner', position='attention_input')


def test_the_wrapped_backbone_refuses_the_attention_input_naming_what_it_conditions():
    init_default_scope('mmdet')
    with pytest.raises(ValueError, match=r"^CondTokBackbone\(SwinTransformer\)\.patch_embed: "
                                         r"position='attention_input' is invalid; use one of 'embedding' "
                                         r"\(CondTokBackbone conditions its targets' outputs; .*name the block's "
                                         r"first norm as a target, e.g. targets=\('stages.0.blocks.0.norm1', \)\)$"):
        MODELS.build(dict(type='CondTokBackbone', backbone=SWIN, conditioning=ATTENTION_INPUT))


def test_the_neck_refuses_the_attention_input_naming_what_it_conditions():
    init_default_scope('mmdet')
    with pytest.raises(ValueError, match=r"^CondTokNeck\(FPN\): position='attention_input' is invalid; use one of "
                                         r"'embedding' \(CondTokNeck conditions the feature maps the neck receives"):
        MODELS.build(dict(type='CondTokNeck', neck=FPN, conditioning=ATTENTION_INPUT))


def test_the_wrapped_backbone_conditions_a_norm1_output_named_as_its_target():
    # what the refusal points to: the first block's norm1 output, kappa <= 2 on what its attention receives
    init_default_scope('mmdet')
    wrapper = MODELS.build(dict(type='CondTokBackbone', backbone=SWIN, targets=('stages.0.blocks.0.norm1', ),
                                token_layout='BNC', conditioning=dict(type='TokenConditioner')))
    seen = {}
    attention = wrapper.wrapped.stages[0].blocks[0].attn
    attention.register_forward_pre_hook(lambda module, args: seen.__setitem__('query', args[0].detach()))
    with torch.no_grad():
        wrapper(torch.randn(2, 3, 32, 32))
    assert (condition_number(seen['query']) <= 2 + 1e-3).all()


@pytest.mark.parametrize('owner, cfg', [
    ('CondSwinTransformer', dict(embed_dims=16, depths=(1, 1), num_heads=(1, 2), window_size=4, strides=(4, 2),
                                 out_indices=(0, 1))),
    ('CondViT', dict(img_size=32, patch_size=4, embed_dim=16, depth=1, num_heads=2, window_size=4,
                     window_block_indexes=(0, ))),
])
def test_the_backbones_that_know_their_blocks_hold_the_attention_input(owner, cfg):
    model = MODELS.build(dict(type=owner, conditioning=ATTENTION_INPUT, **cfg))
    conditioners = model.conditioners.values() if owner == 'CondSwinTransformer' else [model.conditioner]
    assert all(conditioner.placement == Placement(position='attention_input') for conditioner in conditioners)


def test_a_placement_is_one_value_checked_when_it_is_made():
    assert Placement(scope='window', window_size=7, shift_size=3).window == dict(window_size=7, shift_size=3)
    assert Placement().window == {} and Placement(where='a') == Placement(where='b')
    with pytest.raises(ValueError, match=r"^stage 1: position='output' is invalid; use one of 'embedding', "
                                         r"'attention_input'$"):
        Placement(position='output', where='stage 1')
    conditioner = MODELS.build(dict(type='TokenConditioner', scope='window', window_size=4, shift_size=2,
                                    position='attention_input'))
    assert conditioner.placement == Placement('window', 4, 2, 'attention_input')
    assert (conditioner.scope, conditioner.window_size, conditioner.shift_size, conditioner.position) == \
        ('window', 4, 2, 'attention_input')
