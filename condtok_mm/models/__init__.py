from .backbones import CondSwinTransformer, CondTokBackbone, CondViT, SpectralAttentionBackbone, ViTDetViT
from .necks import CondTokNeck, ViTDetFPN, ViTDetLN2d
from .token_conditioner import TokenConditioner
from .valid_region import ValidRegionDetDataPreprocessor

__all__ = [
    'TokenConditioner', 'CondSwinTransformer', 'CondTokBackbone', 'CondViT', 'SpectralAttentionBackbone', 'ViTDetViT',
    'CondTokNeck', 'ViTDetFPN', 'ViTDetLN2d', 'ValidRegionDetDataPreprocessor'
]
