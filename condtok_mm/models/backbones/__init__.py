from .cond_swin import CondSwinTransformer
from .cond_vit import CondViT
from .cond_wrapper import CondTokBackbone
from .spectral_wrapper import SpectralAttentionBackbone
from .vitdet_vit import ViTDetViT

__all__ = ['CondSwinTransformer', 'CondTokBackbone', 'CondViT', 'SpectralAttentionBackbone', 'ViTDetViT']
