from .layer_decay import ViTDetLayerDecayOptimizerConstructor

__all__ = ['ViTDetLayerDecayOptimizerConstructor']
