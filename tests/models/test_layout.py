"""condtok_mm.models.layout against the modules whose layout it reads: the windows mmdet's and mmpretrain's Swin
attend within, the owners of those windows, the wrappers it looks through."""
import pytest
import torch
from mmdet.models.backbones.swin import ShiftWindowMSA as MMDetShiftWindowMSA
from mmpretrain.models.utils.attention import ShiftWindowMSA as MMPretrainShiftWindowMSA

import condtok_mm  # noqa: F401
from condtok_mm.models.layout import (find_attention_modules, first_attention_blocks, owner_windows,
                                      window_owners, window_partition, window_unpartition)
from condtok_mm.registry import MODELS


def attended_windows(msa, tokens, hw_shape):
    """The (B * windows, ws * ws, C) query windows that a Swin ShiftWindowMSA hands to its WindowMSA."""
    seen = {}
    handle = msa.w_msa.register_forward_pre_hook(lambda module, args: seen.__setitem__('windows', args[0]))
    with torch.no_grad():
        msa(tokens, hw_shape)
    handle.remove()
    return seen['windows']


@pytest.mark.parametrize('shift_size', [0, 2])
@pytest.mark.parametrize('hw_shape', [(8, 12), (9, 14), (5, 3)])
@pytest.mark.parametrize('upstream', ['mmdet', 'mmpretrain'])
def test_window_partition_cuts_the_windows_swin_attends_within(upstream, hw_shape, shift_size):
    torch.manual_seed(0)
    if upstream == 'mmdet':
        msa = MMDetShiftWindowMSA(embed_dims=8, num_heads=2, window_size=4, shift_size=shift_size)
    else:  # pad_small_map: mmpretrain otherwise shrinks the window to a grid smaller than it
        msa = MMPretrainShiftWindowMSA(embed_dims=8, num_heads=2, window_size=4, shift_size=shift_size,
                                       pad_small_map=True)
    tokens = torch.randn(2, hw_shape[0] * hw_shape[1], 8)
    windows, padded_hw = window_partition(tokens.view(2, *hw_shape, 8), 4, shift_size)
    assert padded_hw == (-(-hw_shape[0] // 4) * 4, -(-hw_shape[1] // 4) * 4)
    assert torch.equal(windows.reshape(-1, 16, 8), attended_windows(msa, tokens, hw_shape))
    # the owner of those windows reads them off its forward arguments
    assert owner_windows(msa, (tokens, hw_shape)) == (2, hw_shape, 4, shift_size)


@pytest.mark.parametrize('hw_shape', [(6, 6), (7, 10)])
def test_window_unpartition_undoes_an_unshifted_partition(hw_shape):
    grid = torch.randn(3, *hw_shape, 5)
    windows, padded_hw = window_partition(grid, 3)
    assert torch.equal(window_unpartition(windows, 3, padded_hw, hw_shape), grid)


def test_window_owners_are_swin_shift_window_msa_and_vitdet_blocks():
    swin = MODELS.build(dict(type='CondTokBackbone', backbone=dict(type='mmdet.SwinTransformer', embed_dims=8,
                                                                   depths=(2, 1), num_heads=(1, 2), strides=(4, 2),
                                                                   out_indices=(0, 1), window_size=4)))
    attentions = [module for _, module in find_attention_modules(swin)]
    owners = window_owners(swin, attentions)
    assert [index for index, _ in owners] == [0, 1, 2]
    assert [owner.w_msa for _, owner in owners] == attentions
    assert [owner.shift_size for _, owner in owners] == [0, 2, 0]  # the second block of stage 0 is shifted
    # a wrapper is looked through for the first blocks, each stage's unshifted first block
    firsts = first_attention_blocks(swin)
    assert {stage: block for stage, (block, _, _) in firsts.items()} == {
        0: swin.wrapped.stages[0].blocks[0], 1: swin.wrapped.stages[1].blocks[0]}
    assert [(window, shift) for _, window, shift in firsts.values()] == [(4, 0), (4, 0)]

    vit = MODELS.build(dict(type='ViTDetViT', img_size=32, patch_size=8, embed_dim=8, depth=2, num_heads=2,
                            window_size=2, window_block_indexes=[1], pretrain_img_size=32))
    owners = window_owners(vit, [module for _, module in find_attention_modules(vit)])
    assert [owner for _, owner in owners] == list(vit.blocks)
    grid = torch.zeros(3, 5, 7, 8)
    assert [owner_windows(owner, (grid, )) for _, owner in owners] == [(3, (5, 7), 0, 0), (3, (5, 7), 2, 0)]
