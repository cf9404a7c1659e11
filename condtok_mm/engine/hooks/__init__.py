from .attention_conditioning import AttentionConditioningHook, ConditioningProbe
from .strength_ramp import ConditioningStrengthRampHook
from .training_dynamics import TrainingDynamicsHook

__all__ = ['AttentionConditioningHook', 'ConditioningProbe', 'ConditioningStrengthRampHook', 'TrainingDynamicsHook']
