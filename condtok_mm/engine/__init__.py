from .hooks import AttentionConditioningHook
from .optimizers import ViTDetLayerDecayOptimizerConstructor

__all__ = ['AttentionConditioningHook', 'ViTDetLayerDecayOptimizerConstructor']
