"""FastCocoMetric: mmdet's CocoMetric evaluated by faster-coco-eval's C++ COCO evaluation."""
import contextlib
import warnings

from mmdet.evaluation.metrics import CocoMetric
from mmdet.evaluation.metrics import coco_metric as coco_metric_module

from ..registry import METRICS


@METRICS.register_module()
class FastCocoMetric(CocoMetric):
    """COCO bbox/segm/proposal metrics: mmdet's ``CocoMetric``, same arguments and same results, faster.

    pycocotools matches detections to ground truth and accumulates precision/recall in Python, which takes
    most of a COCO evaluation; faster-coco-eval does both in C++ (``tools/benchmark/eval_speed.py`` measures
    the difference). Everything else (result conversion, metric names, the classwise table, the printed
    summary, distributed collection) is CocoMetric's. Use it in a config as
    ``val_evaluator = dict(type='FastCocoMetric', ann_file=..., metric=['bbox', 'segm'])``.

    When faster-coco-eval is not installed, it warns and evaluates with pycocotools, exactly as CocoMetric.

    Args:
        *args, **kwargs: CocoMetric's arguments. ``proposal_nums`` must contain 100 (COCO's mAP is the AP at
            100 detections per image). ``use_mp_eval`` (pycocotools in several processes) applies only to the
            pycocotools fallback.
    """

    def __init__(self, *args, **kwargs) -> None:
        try:
            from .faster_coco_api import COCO, COCOeval
        except ImportError as error:
            warnings.warn(f'FastCocoMetric: faster-coco-eval cannot be imported ({error}), so COCO metrics '
                          'are computed with pycocotools, as CocoMetric does (same numbers, slower). Install '
                          'it with `pip install faster-coco-eval`.')
            self._coco_api_classes = {}
        else:
            self._coco_api_classes = dict(COCO=COCO, COCOeval=COCOeval)
        with self._faster_coco_eval_bound():
            super().__init__(*args, **kwargs)
        if self._coco_api_classes and self.use_mp_eval:
            raise ValueError('FastCocoMetric evaluates with faster-coco-eval; use_mp_eval=True selects '
                             "CocoMetric's multi-process pycocotools evaluation instead. Remove use_mp_eval, "
                             "or use type='CocoMetric' to keep it.")
        if 100 not in self.proposal_nums:
            raise ValueError(f'FastCocoMetric: proposal_nums={tuple(self.proposal_nums)} must contain 100, '
                             'the number of detections per image at which COCO mAP is computed (CocoMetric '
                             'reports mAP=-1 without it). Use e.g. proposal_nums=(100, 300, 1000).')

    @contextlib.contextmanager
    def _faster_coco_eval_bound(self):
        """Bind CocoMetric's ``COCO`` and ``COCOeval`` to faster-coco-eval's while one of our calls runs.

        CocoMetric looks both up as globals of ``mmdet.evaluation.metrics.coco_metric`` (``__init__`` loads
        the annotations with ``COCO``, ``compute_metrics`` evaluates with ``COCOeval``). Binding them there
        for the duration of our call reuses all of CocoMetric's code instead of copying it; CocoMetric
        instances, and anything else that uses that module, see pycocotools before and after.
        """
        upstream = {name: getattr(coco_metric_module, name) for name in self._coco_api_classes}
        for name, cls in self._coco_api_classes.items():
            setattr(coco_metric_module, name, cls)
        try:
            yield
        finally:
            for name, cls in upstream.items():
                setattr(coco_metric_module, name, cls)

    def compute_metrics(self, results: list) -> dict:
        with self._faster_coco_eval_bound():
            return super().compute_metrics(results)
