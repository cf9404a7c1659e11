from .backbones import CondSwinTransformer, CondTokBackbone
from .necks import CondTokNeck
from .token_conditioner import TokenConditioner

__all__ = ['TokenConditioner', 'CondSwinTransformer', 'CondTokBackbone', 'CondTokNeck']
