import pytest
import torch
import torch.nn as nn
from mmdet.registry import OPTIM_WRAPPER_CONSTRUCTORS as MMDET_CONSTRUCTORS
from mmengine.registry import OPTIM_WRAPPER_CONSTRUCTORS as ROOT_CONSTRUCTORS

import condtok_mm  # noqa: F401
from condtok_mm.models.token_conditioner import TokenConditioner
from condtok_mm.registry import MODELS

LR, WD, RATE, DEPTH = 1e-3, 0.1, 0.5, 3


class Detector(nn.Module):
    """backbone + neck + head, the way a detector names its parts."""

    def __init__(self, backbone):
        super().__init__()
        self.backbone = backbone
        self.neck = MODELS.build(dict(type='ViTDetFPN', backbone_channel=32, in_channels=[8, 16, 32, 32],
                                      out_channels=16, norm_cfg=dict(type='ViTDetLN2d')))
        self.head = nn.Linear(16, 4)


class WrappedViT(nn.Module):
    """A backbone that holds the ViT one level down and has parameters of its own named like blocks."""

    def __init__(self):
        super().__init__()
        self.vit = vit()
        self.blocks = nn.Parameter(torch.zeros(3))  # 'blocks' not followed by an index
        self.extra = nn.ModuleDict({'blocks': nn.Linear(2, 2)})  # 'extra.blocks.weight'


def vit(**kwargs):
    return MODELS.build(dict(type='CondViT', img_size=64, embed_dim=32, depth=DEPTH, num_heads=2, window_size=2,
                             window_block_indexes=(0, 2), **kwargs))


def param_groups(model, **paramwise):
    constructor = MMDET_CONSTRUCTORS.build(dict(
        type='ViTDetLayerDecayOptimizerConstructor',
        optim_wrapper_cfg=dict(type='OptimWrapper', optimizer=dict(type='AdamW', lr=LR, weight_decay=WD)),
        paramwise_cfg={**dict(num_layers=DEPTH, decay_rate=RATE, decay_type='layer_wise'), **paramwise}))
    optimizer = constructor(model).optimizer
    name_of = {id(p): name for name, p in model.named_parameters()}
    settings = {}
    for group in optimizer.param_groups:
        for p in group['params']:
            assert name_of[id(p)] not in settings, f'{name_of[id(p)]} is in two groups'
            settings[name_of[id(p)]] = (group['lr'], group['weight_decay'])
    return settings


def test_registered_under_its_own_name_only():
    assert 'ViTDetLayerDecayOptimizerConstructor' in ROOT_CONSTRUCTORS.module_dict
    assert 'LayerDecayOptimizerConstructor' not in ROOT_CONSTRUCTORS.module_dict


def test_learning_rate_decays_from_the_heads_down_to_the_patch_embedding():
    model = Detector(vit())
    model.backbone.blocks[1].mlp.fc2.weight.requires_grad_(False)  # frozen: in no group
    settings = param_groups(model)
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert set(settings) == trainable

    def lr(layer_id):
        return pytest.approx(LR * RATE**(DEPTH + 1 - layer_id))

    assert settings['backbone.pos_embed'] == (lr(0), 0.)
    assert settings['backbone.patch_embed.proj.weight'] == (lr(0), WD)
    assert settings['backbone.patch_embed.proj.bias'] == (lr(0), 0.)
    for block in range(DEPTH):
        prefix = f'backbone.blocks.{block}.'
        assert settings[prefix + 'attn.qkv.weight'] == (lr(block + 1), WD)
        assert settings[prefix + 'attn.qkv.bias'] == (lr(block + 1), 0.)
        assert settings[prefix + 'attn.rel_pos_h'] == (lr(block + 1), WD)  # as in ViTDet: decayed
        assert settings[prefix + 'norm1.weight'] == (lr(block + 1), 0.)
        assert settings[prefix + 'norm2.bias'] == (lr(block + 1), 0.)
    assert settings['backbone.blocks.2.mlp.fc2.weight'] == (pytest.approx(LR * RATE), WD)
    assert settings['neck.fpn1.0.weight'] == (LR, WD)
    assert settings['neck.fpn1.1.weight'] == (LR, 0.)  # ViTDetLN2d, a norm by type
    assert settings['neck.lateral_convs.0.norm_layer.bias'] == (LR, 0.)
    assert settings['neck.lateral_convs.0.conv.weight'] == (LR, WD)
    assert settings['head.weight'] == (LR, WD) and settings['head.bias'] == (LR, 0.)


def test_layer_ids_are_found_wherever_the_vit_sits_in_the_backbone():
    settings = param_groups(Detector(WrappedViT()))
    assert settings['backbone.vit.pos_embed'][0] == pytest.approx(LR * RATE**(DEPTH + 1))
    assert settings['backbone.vit.blocks.0.attn.qkv.weight'][0] == pytest.approx(LR * RATE**DEPTH)
    assert settings['backbone.vit.blocks.2.attn.qkv.weight'][0] == pytest.approx(LR * RATE)
    # names that mention blocks without an index are neither embedding nor block: full learning rate
    assert settings['backbone.blocks'][0] == LR
    assert settings['backbone.extra.blocks.weight'][0] == LR


def test_the_token_conditioners_have_no_parameter_to_give_a_layer():
    # the layer ids name the embedding and the blocks only: a conditioned ViT's conditioners hold nothing to train
    backbone = vit()
    conditioners = [name for name, module in backbone.named_modules() if isinstance(module, TokenConditioner)]
    assert conditioners == ['conditioner']
    assert [name for name, _ in backbone.named_parameters() if name.startswith('conditioner.')] == []


def test_without_weight_decay_in_the_optimizer_the_decayed_groups_keep_its_default():
    constructor = ROOT_CONSTRUCTORS.build(dict(
        type='ViTDetLayerDecayOptimizerConstructor', optim_wrapper_cfg=dict(optimizer=dict(type='AdamW', lr=LR)),
        paramwise_cfg=dict(num_layers=DEPTH, decay_rate=RATE)))
    model = Detector(vit())
    optimizer = constructor(model).optimizer
    decays = {group['weight_decay'] for group in optimizer.param_groups}
    assert decays == {0., torch.optim.AdamW([torch.zeros(1)]).defaults['weight_decay']}


@pytest.mark.parametrize('paramwise, message', [
    (dict(num_layers=2), r"parameter 'blocks.2.norm1.weight' is in block 2 but paramwise_cfg.num_layers=2"),
    (dict(num_layers=0), 'num_layers=0 must be the number of ViT blocks'),
    (dict(decay_rate=1.5), r'decay_rate=1.5 must be a number in \(0, 1\]'),
    (dict(decay_type='stage_wise'), "decay_type='stage_wise' is not supported"),
    (dict(custom_keys={'norm': dict(decay_mult=0.)}), r"keys \['custom_keys'\] are not supported"),
])
def test_invalid_settings_fail_with_a_clear_message(paramwise, message):
    with pytest.raises(ValueError, match=message):
        param_groups(Detector(vit()), **paramwise)


def test_a_model_without_backbone_is_rejected():
    with pytest.raises(ValueError, match='the model has no `backbone`'):
        param_groups(nn.Linear(2, 2))
