"""Run an exported graph with onnxruntime on the CPU."""
from typing import Dict, List, Optional

import numpy as np


def cpu_session(path: str, threads: Optional[int] = None):
    """An onnxruntime InferenceSession of the ONNX graph ``path`` on the CPU provider, with ``threads`` intra-op
    threads (None: onnxruntime's default, one per core)."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    if threads is not None:
        options.intra_op_num_threads = threads
    return onnxruntime.InferenceSession(path, options, providers=['CPUExecutionProvider'])


def run_onnxruntime(path: str, inputs: Dict[str, np.ndarray], threads: Optional[int] = None) -> List[np.ndarray]:
    """The outputs of the ONNX graph ``path`` on ``inputs`` (input name -> array), run by :func:`cpu_session`."""
    return cpu_session(path, threads).run(None, inputs)
