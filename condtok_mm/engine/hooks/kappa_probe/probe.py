"""KappaProbe: the forward hooks that measure kappa of what a backbone's transformer computes."""
from typing import Dict

import torch.nn as nn

from condtok_mm.engine.hooks.kappa_probe.attention_input import AttentionInputKappa
from condtok_mm.engine.hooks.kappa_probe.attention_layers import AttentionLayerKappa
from condtok_mm.engine.hooks.kappa_probe.records import KappaRecords
from condtok_mm.engine.hooks.kappa_probe.tokens import TokenKappa
from condtok_mm.models.layout import conditioner_stage
from condtok_mm.models.token_conditioner import TokenConditioner


class KappaProbe:
    """Forward hooks on a backbone that measure kappa of what its transformer computes.

    Recorded per forward pass while :attr:`active`, each image on its own valid (unpadded) tokens where the
    batch was recorded by ValidRegionDetDataPreprocessor, and reduced to mean and max by :meth:`reduce`:

    - ``kappa/tokens_in/stage{i}``, ``kappa/tokens_out/stage{i}``, ``scale/correction/stage{i}``: the token
      matrices before and after the TokenConditioner of stage i (stage 0: the patch embedding) and the
      factor by which it scales them (:class:`TokenKappa`);
    - ``kappa/attn_input/stage{i}``, ``kappa/attn_input_centred/stage{i}``: what the first attention block
      of every conditioned stage multiplies (stage 0 when the backbone has no conditioner;
      :class:`AttentionInputKappa`);
    - ``kappa/attn_softmax/layer{j}``, ``kappa/attn_out/layer{j}``, ``kappa/w_q/layer{j}``,
      ``kappa/w_k/layer{j}``, ``kappa/w_v/layer{j}``: every attention layer's softmax matrices, heads'
      outputs and per-head projection weights (:class:`AttentionLayerKappa`).

    Args:
        backbone (nn.Module): the model's backbone.
        max_matrices (int): attention matrices per layer and forward pass used for kappa (windows are
            subsampled evenly; all heads of a chosen window are used). Default: 32.
        max_attention_tokens (int): attention matrices larger than this (global attention at high
            resolution: 4096 x 4096 for ViT-B at 1024) are skipped for ``attn_softmax`` because one
            float64 SVD of them costs seconds on a CPU. Default: 1024.
    """

    def __init__(self, backbone: nn.Module, max_matrices: int = 32, max_attention_tokens: int = 1024):
        self.records = KappaRecords()
        conditioners = [(name, m) for name, m in backbone.named_modules() if isinstance(m, TokenConditioner)]
        measured_stages = sorted({conditioner_stage(name) for name, _ in conditioners}) or [0]
        self._recorders = (TokenKappa(self.records, backbone, conditioners),
                           AttentionInputKappa(self.records, backbone, measured_stages, max_matrices),
                           AttentionLayerKappa(self.records, backbone, max_matrices, max_attention_tokens))
        self._attention = self._recorders[-1]
        self.attention_layers = self._attention.layers

    @property
    def active(self) -> bool:
        """Whether the hooks record (set it for the forward passes to measure)."""
        return self.records.active

    @active.setter
    def active(self, value: bool) -> None:
        self.records.active = value

    def reduce(self) -> Dict[str, float]:
        """Mean and max of every recorded quantity across ranks (:meth:`KappaRecords.reduce`); then reset."""
        scalars = self.records.reduce()
        self._attention.clear()
        return scalars

    def remove(self) -> None:
        for recorder in self._recorders:
            for handle in recorder.handles:
                handle.remove()
            recorder.handles = []
