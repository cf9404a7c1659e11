"""condtok_mm.models.layout against the modules whose layout it reads: the owners of the attention windows, the
wrappers it looks through."""
import torch

import condtok_mm  # noqa: F401
from condtok_mm.models.layout import find_attention_modules, first_attention_blocks, owner_windows, window_owners
from condtok_mm.registry import MODELS


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
