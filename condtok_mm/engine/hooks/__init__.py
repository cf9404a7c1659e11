from .attention_kappa import AttentionKappaHook, KappaProbe
from .renamed import RENAMED_HOOKS
from .strength_ramp import ConditioningStrengthRampHook
from .training_dynamics import TrainingDynamicsHook

__all__ = ['AttentionKappaHook', 'KappaProbe', 'ConditioningStrengthRampHook', 'TrainingDynamicsHook', 'RENAMED_HOOKS']
