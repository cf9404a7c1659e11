"""kappa of what the first attention block of a stage multiplies: its norm1 output, per window or image."""
from typing import Dict, Sequence, Tuple

import torch
import torch.nn as nn

from condtok_mm.conditioning import channel_mean_complement, token_windows
from condtok_mm.engine.hooks.kappa_probe.records import KappaRecords, evenly, kappa
from condtok_mm.engine.hooks.kappa_probe.valid_tokens import batch_valid_shapes, image_token_matrices
from condtok_mm.models.layout import block_token_grid, first_attention_blocks


class AttentionInputKappa:
    """Forward hooks recording ``kappa/attn_input/stage{i}``: kappa of the first attention block's norm1 output
    at each of ``stages`` (windowed blocks per window, the block's zero padding left out; global blocks per
    image), each image on its valid tokens; and ``kappa/attn_input_centred/stage{i}``, the same on the
    complement of the all-ones channel vector: norm1 subtracts every token's channel mean, so its output has
    that vector in its null space and the plain kappa is infinite up to rounding (capped at KAPPA_CAP).

    Args:
        records (KappaRecords): where the values go.
        backbone (nn.Module): the backbone; stages whose first block's layout is unknown are not recorded.
        stages (Sequence[int]): the stages to record.
        max_matrices (int): windows per stage and forward pass used for kappa (subsampled evenly).
    """

    def __init__(self, records: KappaRecords, backbone: nn.Module, stages: Sequence[int], max_matrices: int):
        self.records = records
        self.max_matrices = max_matrices
        self.handles = []
        # The token grid each stage's first block is running on, set by a pre-hook on the block.
        self._block_grids: Dict[int, Tuple[int, int]] = {}
        for stage, (block, window_size, shift_size) in first_attention_blocks(backbone).items():
            if stage in stages:
                self.handles.append(block.register_forward_pre_hook(self._block_grid_hook(stage)))
                self.handles.append(block.norm1.register_forward_hook(
                    self._attention_input_hook(stage, window_size, shift_size)))

    def _block_grid_hook(self, stage: int):
        def hook(block, args):
            self._block_grids[stage] = block_token_grid(args)
        return hook

    def _attention_input_hook(self, stage: int, window_size: int, shift_size: int):
        def hook(norm, args, output):
            if not self.records.active:
                return
            hw_shape = self._block_grids[stage]
            tokens = output.reshape(output.shape[0], -1, output.shape[-1])
            valid_shapes = batch_valid_shapes(tokens.shape[0], hw_shape)
            with torch.no_grad():
                matrices = []
                for (h, w), image_tokens in image_token_matrices(tokens, hw_shape, valid_shapes):
                    if window_size <= 0:
                        matrices.append(image_tokens)
                        continue
                    grid = image_tokens.reshape(image_tokens.shape[0], h, w, -1)
                    matrices.extend(windows for _, windows in token_windows(grid, window_size, shift_size))
                for group in matrices:
                    chosen = group[evenly(group.shape[0], self.max_matrices)]
                    self.records.add(f'kappa/attn_input/stage{stage}', kappa(chosen))
                    self.records.add(f'kappa/attn_input_centred/stage{stage}',
                                     kappa(channel_mean_complement(chosen.double())))
        return hook
