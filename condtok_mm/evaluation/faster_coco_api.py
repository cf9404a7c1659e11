"""faster-coco-eval's COCO API in the shape mmdet's CocoMetric drives: ``COCO`` and ``COCOeval``.

Importing this module raises ImportError when faster-coco-eval is not installed.
"""
import numpy as np
from faster_coco_eval import COCO, COCOeval_faster

__all__ = ['COCO', 'COCOeval']


class COCOeval(COCOeval_faster):
    """faster-coco-eval's C++ evaluation, built and summarized like pycocotools' ``COCOeval``.

    CocoMetric builds ``COCOeval(coco_gt, coco_dt, iou_type)``, reads ``stats`` (pycocotools' 12 entries) and
    ``eval['precision']``. ``COCOeval_faster`` computes the same per-image matching and precision/recall
    arrays, but its ``summarize`` reports mAP at ``maxDets[-1]`` (1000 in CocoMetric) where pycocotools
    reports it at 100 detections per image, so the summary is computed here exactly as pycocotools does it.
    The summary lines are printed, as pycocotools prints them.
    """

    def __init__(self, cocoGt=None, cocoDt=None, iouType='segm'):
        super().__init__(cocoGt, cocoDt, iouType, print_function=print)

    def summarize(self):
        if self.params.iouType not in ('bbox', 'segm'):
            return super().summarize()
        if not self.eval:
            raise RuntimeError('Please run accumulate() first')
        max_dets = self.params.maxDets
        self.stats = np.array([
            self._summarize(1, maxDets=100),
            self._summarize(1, iouThr=.5, maxDets=max_dets[2]),
            self._summarize(1, iouThr=.75, maxDets=max_dets[2]),
            self._summarize(1, areaRng='small', maxDets=max_dets[2]),
            self._summarize(1, areaRng='medium', maxDets=max_dets[2]),
            self._summarize(1, areaRng='large', maxDets=max_dets[2]),
            self._summarize(0, maxDets=max_dets[0]),
            self._summarize(0, maxDets=max_dets[1]),
            self._summarize(0, maxDets=max_dets[2]),
            self._summarize(0, areaRng='small', maxDets=max_dets[2]),
            self._summarize(0, areaRng='medium', maxDets=max_dets[2]),
            self._summarize(0, areaRng='large', maxDets=max_dets[2]),
        ])
