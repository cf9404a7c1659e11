from .hooks import AttentionKappaHook
from .optimizers import ViTDetLayerDecayOptimizerConstructor

__all__ = ['AttentionKappaHook', 'ViTDetLayerDecayOptimizerConstructor']
