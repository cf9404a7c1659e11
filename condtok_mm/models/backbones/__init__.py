from .cond_swin import CondSwinTransformer

__all__ = ['CondSwinTransformer']
