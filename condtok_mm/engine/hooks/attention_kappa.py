"""AttentionKappaHook: record, during training, kappa of the embedded tokens, of what attention multiplies and of
every attention layer (measured by :class:`KappaProbe`), and log it. It measures and applies nothing: the
conditioning itself is the TokenConditioner's (condtok_mm/conditioning)."""
import logging
import math
from typing import Dict, Optional

from mmengine.hooks import Hook
from mmengine.logging import print_log
from mmengine.model import is_model_wrapper

from condtok_mm.engine.hooks.kappa_probe import KappaProbe
from condtok_mm.registry import HOOKS


@HOOKS.register_module()
class AttentionKappaHook(Hook):
    """Record kappa of the embedded tokens and of every attention layer every ``interval`` iterations.

    The values (see :class:`KappaProbe` for the list) go to the text log, to every visualizer
    backend (``vis_data/scalars.json``; TensorBoard when ``TensorboardVisBackend`` is configured) under
    ``kappa/<quantity>_{mean,max}/<stage or layer>`` (and ``scale/correction_{mean,max}/<stage>``), and are
    reduced across ranks in distributed runs over the union of what the ranks recorded.
    Recording only reads activations and weights (no RNG, no in-place change), so training is unchanged.

    Args:
        interval (int): record on every ``interval``-th training iteration (and the first). Default: 50.
            tools/benchmark/hook_overhead.py measures what a recording costs (docs/en/benchmarks.md).
        max_matrices (int): attention matrices per layer used at each recording. Default: 32.
        max_attention_tokens (int): skip softmax kappa of larger attention matrices. Default: 1024.
        log_layers (bool): print the per-layer table in the text log, not only the summary line.
            Default: True.
    """

    priority = 'NORMAL'

    def __init__(self, interval: int = 50, max_matrices: int = 32, max_attention_tokens: int = 1024,
                 log_layers: bool = True):
        if not isinstance(interval, int) or interval < 1:
            raise ValueError(f'AttentionKappaHook: interval={interval!r} is invalid; use an int >= 1')
        self.interval = interval
        self.max_matrices = max_matrices
        self.max_attention_tokens = max_attention_tokens
        self.log_layers = log_layers
        self.probe: Optional[KappaProbe] = None

    def before_train(self, runner) -> None:
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        backbone = getattr(model, 'backbone', model)
        self.probe = KappaProbe(backbone, self.max_matrices, self.max_attention_tokens)
        if not self.probe.attention_layers:
            print_log(f'AttentionKappaHook: no attention module with softmax/qkv/proj found in '
                      f'{type(backbone).__name__}; only token kappa is recorded.', logger='current',
                      level=logging.WARNING)

    def _records(self, runner) -> bool:
        return runner.iter == 0 or self.every_n_train_iters(runner, self.interval)

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        self.probe.active = self._records(runner)

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        if not self.probe.active:
            return
        self.probe.active = False
        scalars = self.probe.reduce()
        if not scalars:
            return
        step = runner.iter + 1
        runner.visualizer.add_scalars(scalars, step=step)
        runner.logger.info(format_kappa(scalars, step, self.log_layers))

    def after_train(self, runner) -> None:
        self.probe.remove()


def format_kappa(scalars: Dict[str, float], step: int, per_layer: bool = True) -> str:
    """A summary line (token kappa; attention kappa averaged over layers) and an optional layer table."""
    def value(key):
        return scalars.get(key, math.nan)

    stages = sorted({k.rsplit('/', 1)[1] for k in scalars if k.startswith('kappa/tokens_in_mean/')})
    layers = sorted({k.rsplit('/', 1)[1] for k in scalars if k.startswith('kappa/attn_out_mean/')})
    parts = []
    for stage in stages:
        part = (f'{stage} tokens kappa {value(f"kappa/tokens_in_mean/{stage}"):.3g} -> '
                f'{value(f"kappa/tokens_out_mean/{stage}"):.3g}')
        if f'scale/correction_mean/{stage}' in scalars:
            part += f' (scale x{value(f"scale/correction_mean/{stage}"):.3g})'
        if f'kappa/attn_input_centred_mean/{stage}' in scalars:
            part += f', attention input kappa {value(f"kappa/attn_input_centred_mean/{stage}"):.3g} (centred)'
        parts.append(part)
    for quantity in ('attn_softmax', 'attn_out'):
        means = [value(f'kappa/{quantity}_mean/{layer}') for layer in layers]
        means = [m for m in means if not math.isnan(m)]
        if means:
            parts.append(f'{quantity} kappa (mean over layers) {sum(means) / len(means):.3g}')
    lines = [f'Iter(train) [{step}] kappa: ' + ' | '.join(parts)]
    if per_layer and layers:
        columns = ('attn_softmax_mean', 'attn_softmax_max', 'attn_out_mean', 'attn_out_max', 'w_q_mean',
                   'w_k_mean', 'w_v_mean')
        lines.append('    layer   ' + ' '.join(f'{c:>17}' for c in columns))
        for layer in layers:
            lines.append(f'    {layer} ' + ' '.join(f'{value(f"kappa/{c}/{layer}"):17.4g}' for c in columns))
    return '\n'.join(lines)
