"""TokenConditioner: the config-buildable module around :mod:`condtok_mm.conditioning`."""
from typing import Optional

import torch
from mmengine.model import BaseModule

from condtok_mm.conditioning import CONDITIONING_METHODS, CONDITIONING_MODES, condition_tokens
from condtok_mm.registry import MODELS


@MODELS.register_module()
class TokenConditioner(BaseModule):
    """Add the correction C to each image's token matrix X so that kappa(X + C) <= ``target_kappa``.

    It has no parameters and no buffers (adding it never changes a state dict) and is recomputed for every
    input, in training and inference. See :func:`condtok_mm.conditioning.condition_tokens` for the math.

    Args:
        mode (str): 'sigma_max' (the paper's C = s_1 U V^T, all singular values shifted by s_1) or
            'floor' (only singular values below s_1 / target_kappa are lifted). Default: 'sigma_max'.
        alpha (float): scale of the correction, >= 0; 1 reaches the bound. Default: 1.0.
        target_kappa (float): the bound on kappa, > 1. Default: 2.0.
        detach (bool): treat C as a constant in backward (the paper is silent; we default to the cheaper,
            always well-defined choice). Default: True.
        method (str): 'gram' (Gram-matrix eigendecomposition, cheap for N >> d) or 'svd' (reference).
            Default: 'gram'.
        init_cfg (dict, optional): unused (no parameters); kept for the BaseModule interface.
    """

    def __init__(self,
                 mode: str = 'sigma_max',
                 alpha: float = 1.0,
                 target_kappa: float = 2.0,
                 detach: bool = True,
                 method: str = 'gram',
                 init_cfg: Optional[dict] = None):
        super().__init__(init_cfg=init_cfg)
        if mode not in CONDITIONING_MODES:
            raise ValueError(f'TokenConditioner: mode={mode!r} is not supported; valid modes are '
                             f'{", ".join(CONDITIONING_MODES)}')
        if method not in CONDITIONING_METHODS:
            raise ValueError(f'TokenConditioner: method={method!r} is not supported; valid methods are '
                             f'{", ".join(CONDITIONING_METHODS)}')
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not alpha >= 0:
            raise ValueError(f'TokenConditioner: alpha={alpha!r} is invalid; use a number >= 0 '
                             '(1.0 reaches the bound, 0 disables the correction)')
        if isinstance(target_kappa, bool) or not isinstance(target_kappa, (int, float)) \
                or not target_kappa > 1:
            raise ValueError(f'TokenConditioner: target_kappa={target_kappa!r} is invalid; use a number '
                             '> 1 (the paper uses 2.0)')
        if not isinstance(detach, bool):
            raise ValueError(f'TokenConditioner: detach={detach!r} is invalid; use True or False')
        self.mode = mode
        self.alpha = float(alpha)
        self.target_kappa = float(target_kappa)
        self.detach = detach
        self.method = method
        # Set by the owning backbone so that errors name the place, e.g. 'CondSwinTransformer stage 0'.
        self.location = type(self).__name__

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Condition tokens of shape (B, N, C): one N x C matrix per image."""
        return condition_tokens(tokens, mode=self.mode, alpha=self.alpha,
                                target_kappa=self.target_kappa, detach=self.detach,
                                method=self.method, where=self.location)

    def extra_repr(self) -> str:
        return (f'mode={self.mode!r}, alpha={self.alpha}, target_kappa={self.target_kappa}, '
                f'detach={self.detach}, method={self.method!r}')
