from .neon_trees import make_neon_trees_dataset
from .shapes import SHAPE_CLASSES, make_shapes_dataset
from .shapes_classification import ShapesClassificationDataset, largest_instance_labels

__all__ = ['SHAPE_CLASSES', 'make_shapes_dataset', 'ShapesClassificationDataset', 'largest_instance_labels',
           'make_neon_trees_dataset']
