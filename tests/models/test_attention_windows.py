"""condtok_mm.models.attention_windows against the windows mmdet's and mmpretrain's Swin attend within."""
import pytest
import torch
from mmdet.models.backbones.swin import ShiftWindowMSA as MMDetShiftWindowMSA
from mmpretrain.models.utils.attention import ShiftWindowMSA as MMPretrainShiftWindowMSA

from condtok_mm.models.attention_windows import window_partition, window_unpartition
from condtok_mm.models.layout import owner_windows


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
