"""The whole detector through torch's ONNX exporter: tried, and reported where it stops.

:func:`export_detector` exports mmdet's ``mode='tensor'`` forward (the heads' raw outputs) and prints the error the
exporter stops with. With mmdet 3.3 and torch 2.14 that is mmdet's box decoding, which imports a module of mmdet 2.x
under an ONNX export (``mmdet.core.export``); past it, the RPN's proposals are data-dependent (a branch on their
sizes, then NMS: a different number per image). docs/en/user_guides/deployment.md#the-whole-detector gives the
details; the backbone is the supported route.
"""
from typing import Sequence

import torch

from condtok_mm.deployment.export import export_onnx, use_exportable_solver


class DetectorTensorForward(torch.nn.Module):
    """A detector's ``mode='tensor'`` forward on one image of a fixed size (the data sample holds its metainfo).

    Args:
        detector (nn.Module): an mmdet detector.
        shape (Sequence[int]): the image's (H, W).
    """

    def __init__(self, detector: torch.nn.Module, shape: Sequence[int]):
        super().__init__()
        from mmdet.structures import DetDataSample
        self.detector = detector
        height, width = shape
        self.samples = [DetDataSample(metainfo=dict(img_shape=(height, width), ori_shape=(height, width),
                                                    pad_shape=(height, width), batch_input_shape=(height, width),
                                                    scale_factor=(1.0, 1.0)))]

    def forward(self, image: torch.Tensor):
        return self.detector(image, self.samples, mode='tensor')


def export_detector(detector: torch.nn.Module, shape: Sequence[int], path: str) -> int:
    """Try to export ``detector``; print where the exporter stops (or the file) and return the exit status: 1 where
    it stops, 0 where it wrote ``path``.

    Args:
        detector (nn.Module): an mmdet detector in eval mode; its conditioners are switched to Newton-Schulz.
        shape (Sequence[int]): the (H, W) of the one image the graph takes.
        path (str): the .onnx file to write.
    """
    for message in use_exportable_solver(detector):
        print(message)
    image = torch.zeros(1, 3, *shape)
    try:
        export_onnx(DetectorTensorForward(detector, shape), (image, ), path, ['image'], ['outputs'])
    except Exception as error:  # the exporter wraps what stopped it; its summary names the cause
        print(f'torch.onnx.export of the whole {type(detector).__name__} stops: {_summary(error)}\nExport the '
              'backbone with --backbone-only (the supported route; docs/en/user_guides/deployment.md).')
        return 1
    print(f'exported the whole {type(detector).__name__} to {path}')
    return 0


def _summary(error: Exception) -> str:
    """The exporter's 'Exception summary' line (the cause it wraps), or the error itself."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    causes = [line for line in lines if line.startswith("<class '")]
    return causes[-1] if causes else f'{type(error).__name__}: {lines[0] if lines else ""}'
