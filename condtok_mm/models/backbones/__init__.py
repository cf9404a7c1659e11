from .cond_swin import CondSwinTransformer
from .cond_wrapper import CondTokBackbone

__all__ = ['CondSwinTransformer', 'CondTokBackbone']
