from .attention_conditioning import AttentionConditioningHook, ConditioningProbe

__all__ = ['AttentionConditioningHook', 'ConditioningProbe']
