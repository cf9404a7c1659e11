from .backbones import CondSwinTransformer
from .token_conditioner import TokenConditioner

__all__ = ['TokenConditioner', 'CondSwinTransformer']
