from .fast_coco_metric import FastCocoMetric

__all__ = ['FastCocoMetric']
