"""Token-scale controls: r X or (X + C) / r with r = ||X + C||_F / ||X||_F per image, constant in backward."""
from typing import Optional

import torch

from .valid_sizes import valid_region_mask


def match_token_scale(x: torch.Tensor, conditioned: torch.Tensor, control: str,
                      sizes: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Token-scale control of the conditioning: r X (``'scale_matched'``) or (X + C) / r (``'norm_matched'``),
    with r = ||X + C||_F / ||X||_F of each image, computed in float64 and constant in backward (the ``control``
    option of :class:`.options.ConditioningOptions`, which checks it; the functional API applies it).

    Args:
        x (Tensor): the tokens before conditioning, (B, N, d) or grids (B, H, W, d).
        conditioned (Tensor): X + C, same shape.
        control (str): 'scale_matched' or 'norm_matched'.
        sizes (Tensor, optional): (B, 2), per image the (h, w) of its valid tokens in grids ``x``: r is taken over
            them and only they are changed (the padding passes unchanged, as the conditioning leaves it). None:
            every token of the image. Default: None.

    Returns:
        Tensor: same shape and dtype as ``x``. An image whose X is zero gets r = 1 (X + C = X = 0).
    """
    with torch.no_grad():
        tokens, corrected = x.double(), conditioned.double()
        if sizes is None:
            mask = torch.ones(x.shape[:-1] + (1, ), dtype=torch.bool, device=x.device)
        else:
            mask = valid_region_mask(sizes, x.shape[1], x.shape[2]).unsqueeze(-1)
        dims = tuple(range(1, x.dim()))
        zero = torch.zeros((), dtype=torch.float64, device=x.device)
        tokens_norm = torch.where(mask, tokens, zero).square().sum(dims, keepdim=True).sqrt()
        conditioned_norm = torch.where(mask, corrected, zero).square().sum(dims, keepdim=True).sqrt()
        ratio = torch.where(tokens_norm > 0, conditioned_norm / torch.where(tokens_norm > 0, tokens_norm, 1.0), 1.0)
        scale = torch.where(mask, ratio, 1.0).to(x.dtype)  # image-wide r on the valid tokens, 1 on the padding
    # the scale is a constant: gradients are r I (scale-matched) or those of X + C times 1 / r (norm-matched)
    return x * scale if control == 'scale_matched' else conditioned / scale
