"""Where and whether a model is conditioned is checked when it is built: a wrong ``conditioning``,
``condition_stages``, ``targets`` or ``levels`` raises a ValueError that names the model, the argument and
the fix, and a conditioning config with nowhere to act is refused instead of building an unconditioned model."""
import re

import pytest
import torch
from mmdet.models.backbones import SwinTransformer
from mmengine.registry import init_default_scope

import condtok_mm  # noqa: F401
from condtok_mm.models import TokenConditioner
from condtok_mm.registry import MODELS

SMALL_SWIN = dict(embed_dims=16, depths=(1, 1, 1, 1), num_heads=(1, 2, 2, 4), window_size=4)
SMALL_VIT = dict(img_size=32, patch_size=8, embed_dim=16, depth=1, num_heads=2, window_size=0, window_block_indexes=(),
                 pretrain_img_size=32)
FPN = dict(type='mmdet.FPN', in_channels=[8, 16], out_channels=8, num_outs=2)
NOT_A_CONFIG = [True, 'TokenConditioner', 1.0]
CONFIG_FIX = r"use a conditioner config such as dict\(type='TokenConditioner'\), or None for the unconditioned model"


def build(cfg):
    init_default_scope('mmdet')
    return MODELS.build(cfg)


def swin(**kwargs):
    return build(dict(type='CondSwinTransformer', **SMALL_SWIN, **kwargs))


@pytest.mark.parametrize('conditioning', NOT_A_CONFIG)
@pytest.mark.parametrize('model, where', [
    (dict(type='CondSwinTransformer', **SMALL_SWIN), 'CondSwinTransformer'),
    (dict(type='CondViT', **SMALL_VIT), 'CondViT'),
    (dict(type='CondTokBackbone', backbone=dict(type='mmdet.SwinTransformer', **SMALL_SWIN)), 'CondTokBackbone'),
    (dict(type='CondTokNeck', neck=FPN), 'CondTokNeck'),
], ids=['swin', 'vit', 'backbone-wrapper', 'neck'])
def test_conditioning_must_be_a_config_or_none(model, where, conditioning):
    message = rf'^{where}: conditioning={re.escape(repr(conditioning))} is invalid; {CONFIG_FIX}$'
    with pytest.raises(ValueError, match=message):
        build(dict(model, conditioning=conditioning))


@pytest.mark.parametrize('stages', [5, '0', (True, ), (0, 0), (4, ), (-1, ), (0.0, ), None],
                         ids=['int', 'str', 'bool', 'repeated', 'past-the-end', 'negative', 'float', 'none'])
def test_condition_stages_must_be_distinct_stage_indices(stages):
    with pytest.raises(ValueError, match=rf'^CondSwinTransformer: condition_stages={re.escape(repr(stages))} is '
                                         r'invalid; use distinct stage indices from \[0, 1, 2, 3\] in a sequence '
                                         r'such as \(0, \)'):
        swin(condition_stages=stages)


def test_a_stage_list_of_any_iterable_builds_those_stages():
    assert swin(condition_stages=[2, 0]).condition_stages == (2, 0)
    assert list(swin(condition_stages=range(2)).conditioners) == ['0', '1']


def test_conditioning_with_no_stage_is_refused_and_none_with_no_stage_is_the_plain_swin():
    with pytest.raises(ValueError, match=r"^CondSwinTransformer: condition_stages=\(\) conditions nothing, but "
                                         r"conditioning is set \(\{'type': 'TokenConditioner'\}\); say where to "
                                         r'condition, e.g. condition_stages=\(0, \), or set conditioning=None'):
        swin(condition_stages=())
    torch.manual_seed(0)
    plain = SwinTransformer(**SMALL_SWIN)
    torch.manual_seed(0)
    unconditioned = swin(condition_stages=(), conditioning=None)
    assert not [m for m in unconditioned.modules() if isinstance(m, TokenConditioner)]
    x = torch.randn(1, 3, 32, 32)
    for ours, theirs in zip(unconditioned(x), plain(x)):
        assert torch.equal(ours, theirs)


WRAPPED_SWIN = dict(type='mmdet.SwinTransformer', **SMALL_SWIN)


@pytest.mark.parametrize('targets', ['patch_embed', 5, ('patch_embed', 'patch_embed'), ('patch_embed', 0)],
                         ids=['one-name', 'int', 'repeated', 'not-a-name'])
def test_targets_must_be_distinct_submodule_names(targets):
    with pytest.raises(ValueError, match=rf'^CondTokBackbone: targets={re.escape(repr(targets))} is invalid; use '
                                         r"distinct submodule names in a sequence such as \('patch_embed', \)$"):
        build(dict(type='CondTokBackbone', backbone=WRAPPED_SWIN, targets=targets))


def test_a_wrapper_conditioning_no_target_is_refused():
    with pytest.raises(ValueError, match=r'^CondTokBackbone: targets=\(\) conditions nothing, but conditioning is '
                                         r"set \(\{'type': 'TokenConditioner'\}\); say where to condition, e.g. "
                                         r"targets=\('patch_embed', \), or set conditioning=None"):
        build(dict(type='CondTokBackbone', backbone=WRAPPED_SWIN, targets=()))
    wrapper = build(dict(type='CondTokBackbone', backbone=WRAPPED_SWIN, targets=(), conditioning=None))
    assert wrapper.targets == () and not len(wrapper.conditioners)


@pytest.mark.parametrize('levels', [5, (0, 0), ('0', ), (1.0, )], ids=['int', 'repeated', 'str', 'float'])
def test_neck_levels_must_be_distinct_level_indices(levels):
    with pytest.raises(ValueError, match=rf'^CondTokNeck: levels={re.escape(repr(levels))} is invalid; use distinct '
                                         r'level indices \(negative from the last\) in a sequence such as \(0, 2\), '
                                         r'or None'):
        build(dict(type='CondTokNeck', neck=FPN, levels=levels))


def test_a_neck_conditioning_no_level_is_refused():
    with pytest.raises(ValueError, match=r'^CondTokNeck: levels=\(\) conditions nothing, but conditioning is set '
                                         r"\(\{'type': 'TokenConditioner'\}\); say where to condition, e.g. "
                                         r'levels=\(0, \) or levels=None, or set conditioning=None'):
        build(dict(type='CondTokNeck', neck=FPN, levels=()))
    assert build(dict(type='CondTokNeck', neck=FPN, levels=[-1])).levels == (-1, )


def test_an_unknown_neck_token_layout_is_refused_naming_the_layouts():
    with pytest.raises(ValueError, match=r"^CondTokNeck: token_layout='NCHW' is invalid; use one of 'BNC', 'BHWC', "
                                         r"'BCHW'$"):
        build(dict(type='CondTokNeck', neck=FPN, token_layout='NCHW'))
