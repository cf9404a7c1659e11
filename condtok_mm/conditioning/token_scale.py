"""Token-scale controls: r X or (X + C) / r with r = ||X + C||_F / ||X||_F per image, constant in backward."""
from typing import Optional, Sequence, Tuple, Union

import torch

from .modes import TOKEN_SCALE_CONTROLS
from .valid_sizes import valid_size_tensor


def match_token_scale(x: torch.Tensor, conditioned: torch.Tensor, control: str,
                      valid_shapes: Optional[Union[Sequence[Tuple[int, int]], torch.Tensor]] = None) -> torch.Tensor:
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
        raise ValueError(f'match_token_scale: control={control!r} is invalid; use one of '
                         f'{", ".join(map(repr, TOKEN_SCALE_CONTROLS))}')
    if conditioned.shape != x.shape:
        raise ValueError(f'match_token_scale: tokens {tuple(x.shape)} and conditioned tokens '
                         f'{tuple(conditioned.shape)} differ in shape')
    if valid_shapes is not None and x.dim() != 4:
        raise ValueError(f'match_token_scale: valid_shapes needs token grids (B, H, W, d), got {tuple(x.shape)}')
    with torch.no_grad():
        tokens, corrected = x.double(), conditioned.double()
        if valid_shapes is None:
            mask = torch.ones(x.shape[:-1] + (1, ), dtype=torch.bool, device=x.device)
        else:
            sizes = valid_size_tensor(valid_shapes, x.shape[0], x.device, 'match_token_scale')
            rows = torch.arange(x.shape[1], device=x.device)
            cols = torch.arange(x.shape[2], device=x.device)
            mask = ((rows[None, :, None] < sizes[:, 0, None, None])
                    & (cols[None, None, :] < sizes[:, 1, None, None])).unsqueeze(-1)
        dims = tuple(range(1, x.dim()))
        zero = torch.zeros((), dtype=torch.float64, device=x.device)
        tokens_norm = torch.where(mask, tokens, zero).square().sum(dims, keepdim=True).sqrt()
        conditioned_norm = torch.where(mask, corrected, zero).square().sum(dims, keepdim=True).sqrt()
        ratio = torch.where(tokens_norm > 0, conditioned_norm / torch.where(tokens_norm > 0, tokens_norm, 1.0), 1.0)
        scale = torch.where(mask, ratio, 1.0).to(x.dtype)  # image-wide r on the valid tokens, 1 on the padding
    # the scale is a constant: gradients are r I (scale-matched) or those of X + C times 1 / r (norm-matched)
    return x * scale if control == 'scale_matched' else conditioned / scale
