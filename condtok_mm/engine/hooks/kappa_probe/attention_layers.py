"""kappa of every attention layer: its softmax matrices, its heads' outputs and its projection weights."""
import logging
from typing import Dict, Optional, Tuple

import torch
import torch.nn as nn
from mmengine.logging import print_log

from condtok_mm.engine.hooks.kappa_probe.records import KappaRecords, evenly, kappa
from condtok_mm.engine.hooks.kappa_probe.valid_tokens import (batch_valid_shapes, valid_token_mask,
                                                              window_token_mask)
from condtok_mm.models.layout import find_attention_modules, owner_windows, window_owners


class AttentionLayerKappa:
    """Forward hooks on every attention layer j (:func:`condtok_mm.models.layout.find_attention_modules`)
    recording

    - ``kappa/attn_softmax/layer{j}``: kappa of the softmax attention matrix of each head and window,
      restricted to valid tokens (queries and keys) where the window layout is known (Swin, ViTDet);
    - ``kappa/attn_out/layer{j}``: kappa of each head's attention output A(X) = softmax(.) V (valid tokens
      x head dim);
    - ``kappa/w_q/layer{j}``, ``kappa/w_k/layer{j}``, ``kappa/w_v/layer{j}``: kappa of each head's block of
      the projection weights (head dim x C), the matrices of the paper's per-head bound.

    Args:
        records (KappaRecords): where the values go.
        backbone (nn.Module): the backbone.
        max_matrices (int): attention matrices per layer and forward pass used for kappa (windows are
            subsampled evenly; all heads of a chosen window are used).
        max_attention_tokens (int): attention matrices larger than this are skipped for ``attn_softmax``.
    """

    def __init__(self, records: KappaRecords, backbone: nn.Module, max_matrices: int, max_attention_tokens: int):
        self.records = records
        self.max_matrices = max_matrices
        self.max_attention_tokens = max_attention_tokens
        self.layers = find_attention_modules(backbone)
        self.handles = []
        self._skipped_large_attention = False
        # Token validity of the windows (or images) each attention layer is running on, set by a pre-hook
        # on the module that owns the window layout.
        self._token_masks: Dict[int, Optional[torch.Tensor]] = {}
        for index, owner in window_owners(backbone, [attention for _, attention in self.layers]):
            self.handles.append(owner.register_forward_pre_hook(self._layout_hook(index)))
        for index, (_, attention) in enumerate(self.layers):
            self.handles.append(attention.softmax.register_forward_hook(self._softmax_hook(index)))
            self.handles.append(attention.proj.register_forward_pre_hook(self._proj_hook(index)))

    def clear(self) -> None:
        self._token_masks.clear()

    def _layout_hook(self, index: int):
        def hook(owner, args):
            if not self.records.active:
                return
            batch, hw_shape, window_size, shift_size = owner_windows(owner, args)
            mask = valid_token_mask(batch, hw_shape, batch_valid_shapes(batch, hw_shape))
            self._token_masks[index] = (window_token_mask(mask, window_size, shift_size) if window_size > 0
                                        else mask.flatten(1))
        return hook

    def _chosen_matrices(self, index: int, count: int, heads: int) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Evenly chosen window (or image) indices among those with a valid token, and their token masks."""
        mask = self._token_masks.get(index)
        if mask is None or mask.shape[0] != count:
            return evenly(count, max(1, self.max_matrices // heads)), None
        candidates = mask.any(dim=1).nonzero().flatten()
        chosen = candidates[evenly(len(candidates), max(1, self.max_matrices // heads))]
        return chosen, mask[chosen]

    def _softmax_hook(self, index: int):
        def hook(module, args, attn):
            if not self.records.active:
                return
            tokens = attn.shape[-1]
            if tokens > self.max_attention_tokens:
                if not self._skipped_large_attention:
                    print_log(f'AttentionKappaHook: attention matrices of {tokens} tokens are '
                              f'larger than max_attention_tokens={self.max_attention_tokens}; their '
                              'softmax kappa is not recorded (raise the limit to include them).',
                              logger='current', level=logging.WARNING)
                    self._skipped_large_attention = True
                return
            with torch.no_grad():
                chosen, masks = self._chosen_matrices(index, attn.shape[0], attn.shape[1])
                if masks is None:
                    self.records.add(f'kappa/attn_softmax/layer{index:02d}',
                                     kappa(attn[chosen].reshape(-1, tokens, tokens)))
                    return
                for window, valid in zip(chosen, masks):
                    keep = valid.nonzero().flatten()
                    matrices = attn[window][:, keep][:, :, keep]
                    self.records.add(f'kappa/attn_softmax/layer{index:02d}', kappa(matrices))
        return hook

    def _proj_hook(self, index: int):
        def hook(module, args):
            if not self.records.active:
                return
            attention = self.layers[index][1]
            heads = attention.num_heads
            x = args[0]  # (B*, ..., C): the heads' outputs concatenated, before the projection
            x = x.reshape(x.shape[0], -1, heads, x.shape[-1] // heads)
            with torch.no_grad():
                chosen, masks = self._chosen_matrices(index, x.shape[0], heads)
                if masks is None:
                    per_head = x[chosen].permute(0, 2, 1, 3).reshape(-1, x.shape[1], x.shape[-1])
                    self.records.add(f'kappa/attn_out/layer{index:02d}', kappa(per_head))
                else:
                    for window, valid in zip(chosen, masks):
                        self.records.add(f'kappa/attn_out/layer{index:02d}',
                                         kappa(x[window][valid.nonzero().flatten()].transpose(0, 1)))
                weight = attention.qkv.weight.detach()
                for name, part in zip(('w_q', 'w_k', 'w_v'), weight.chunk(3, dim=0)):
                    per_head_weights = part.reshape(heads, part.shape[0] // heads, part.shape[1])
                    self.records.add(f'kappa/{name}/layer{index:02d}', kappa(per_head_weights))
        return hook
