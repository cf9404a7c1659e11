"""Spectral conditioning of attention: the query, key and value projections shifted by lambda * I.

Pure PyTorch, no OpenMMLab imports. Reference: H. Saratchandran and S. Lucey, spectral conditioning of
attention, arXiv 2603.07162 (the follow-up of "Enhancing Transformers Through Conditioned Embedded Tokens").

Every attention layer computes q = W_q x, k = W_k x, v = W_v x (plus biases) from its input tokens x (d
channels). Spectral conditioning replaces each of the three d x d matrices W by W + lambda I, a fixed,
parameter-free shift (lambda = 10 in the paper) that moves the singular values of W away from zero:

    (W + lambda I) x + b = (W x + b) + lambda x.

It is applied in the forward, to the projection's output, and never written into the weights: a checkpoint
trained without it loads unchanged, and the state dict of a model that uses it holds the raw W (the shift is
part of the architecture, like a residual connection, not of the parameters). lambda = 0 is the plain model.

Fused projections: one Linear d -> k d computes the stacked blocks [W_1 x; ...; W_k x] (k = 3 for ``qkv``,
2 for ``kv``); each block is a square W_j and gets its own lambda I, i.e. lambda [x; ...; x] is added. Heads
are contiguous slices of each block (mmdet's Swin, mmpretrain's attention modules and ViTDet all reshape the
output as (k, heads, head_dim)), so head h's query projection becomes W_q^h + lambda [0 ... I ... 0]: each
head's block is shifted by lambda times the identity on its own channels. The projections of a model are
found by :func:`condtok_mm.models.layout.attention_projections`.
"""
import torch

__all__ = ['add_scaled_identity']


def add_scaled_identity(projected: torch.Tensor, x: torch.Tensor, lam: float) -> torch.Tensor:
    """(W + lambda I) x for every square block of a projection, from its output ``projected`` = W x.

    Args:
        projected (Tensor): the projection's output (..., k * d): k stacked blocks of d channels.
        x (Tensor): its input (..., d).
        lam (float): lambda.

    Returns:
        Tensor: ``projected`` + lambda [x; ...; x], same shape.
    """
    channels = x.shape[-1]
    blocks = projected.shape[-1] // channels
    return (projected.unflatten(-1, (blocks, channels)) + lam * x.unsqueeze(-2)).flatten(-2)
