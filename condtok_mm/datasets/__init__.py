from .shapes import SHAPE_CLASSES, make_shapes_dataset

__all__ = ['SHAPE_CLASSES', 'make_shapes_dataset']
