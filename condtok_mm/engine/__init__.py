from .hooks import AttentionConditioningHook

__all__ = ['AttentionConditioningHook']
