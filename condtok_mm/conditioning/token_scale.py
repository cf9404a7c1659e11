"""Token-scale controls: r X or (X + C) / r with r = ||X + C||_F / ||X||_F per image, constant in backward."""
from typing import Optional, Sequence, Tuple

import torch

from .modes import TOKEN_SCALE_CONTROLS


def match_token_scale(x: torch.Tensor, conditioned: torch.Tensor, control: str,
                      valid_shapes: Optional[Sequence[Tuple[int, int]]] = None) -> torch.Tensor:
    """Token-scale control of the conditioning: r X (``'scale_matched'``) or (X + C) / r (``'norm_matched'``),
    with r = ||X + C||_F / ||X||_F of each image, computed in float64 and constant in backward.

    Args:
        x (Tensor): the tokens before conditioning, (B, N, d) or grids (B, H, W, d).
        conditioned (Tensor): X + C, same shape (from :func:`condition_tokens` or
            :func:`condition_valid_regions`).
        control (str): 'scale_matched' or 'norm_matched'.
        valid_shapes (Sequence[tuple[int, int]], optional): per image, the (h, w) of its valid tokens in a grid
            input: r is taken over them and only they are changed (the padding passes unchanged, as the
            conditioning leaves it). None: every token of the image. Default: None.

    Returns:
        Tensor: same shape and dtype as ``x``. An image whose X is zero gets r = 1 (X + C = X = 0).
    """
    if control not in TOKEN_SCALE_CONTROLS:
        raise ValueError(f'token-scale control must be one of {TOKEN_SCALE_CONTROLS}, got {control!r}')
    if conditioned.shape != x.shape:
        raise ValueError(f'match_token_scale: tokens {tuple(x.shape)} and conditioned tokens '
                         f'{tuple(conditioned.shape)} differ in shape')
    if valid_shapes is not None and x.dim() != 4:
        raise ValueError(f'match_token_scale: valid_shapes needs token grids (B, H, W, d), got {tuple(x.shape)}')
    batch = x.shape[0]
    with torch.no_grad():
        scale = torch.ones((batch, ) + (1, ) * (x.dim() - 1), dtype=torch.float64, device=x.device)
        if valid_shapes is None:
            scale = scale.expand((batch, ) + x.shape[1:-1] + (1, )).clone()
            regions = [(image, (slice(None), ) * (x.dim() - 2)) for image in range(batch)]
        else:
            scale = scale.expand(x.shape[:-1] + (1, )).clone()
            regions = [(image, (slice(0, h), slice(0, w))) for image, (h, w) in enumerate(valid_shapes)]
        for image, region in regions:
            tokens_norm = torch.linalg.vector_norm(x[image][region].double())
            if tokens_norm > 0:
                ratio = torch.linalg.vector_norm(conditioned[image][region].double()) / tokens_norm
                scale[image][region] = ratio
        scale = scale.to(x.dtype)
    # the scale is a constant: gradients are r I (scale-matched) or those of X + C times 1 / r (norm-matched)
    return x * scale if control == 'scale_matched' else conditioned / scale
