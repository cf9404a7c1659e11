from .cond_neck import CondTokNeck

__all__ = ['CondTokNeck']
