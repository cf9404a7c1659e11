from .attention_conditioning import AttentionConditioningHook, ConditioningProbe
from .training_dynamics import TrainingDynamicsHook

__all__ = ['AttentionConditioningHook', 'ConditioningProbe', 'TrainingDynamicsHook']
