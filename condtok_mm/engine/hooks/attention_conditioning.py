"""Record the conditioning of the embedded tokens and of every attention layer during training."""
import logging
import math
from collections import defaultdict
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn as nn
from mmengine.dist import all_reduce, get_world_size
from mmengine.hooks import Hook
from mmengine.logging import print_log
from mmengine.model import is_model_wrapper

from condtok_mm.conditioning import condition_number
from condtok_mm.models.token_conditioner import TokenConditioner
from condtok_mm.registry import HOOKS

# A float64 SVD cannot resolve a smallest singular value below ~1e-16 s_max: larger kappa means
# "numerically singular", and capping keeps means and plots finite.
KAPPA_CAP = 1e16


def _kappa(matrices: torch.Tensor) -> torch.Tensor:
    """kappa of each matrix of a (M, rows, cols) batch, float64, capped at KAPPA_CAP."""
    return condition_number(matrices).clamp(max=KAPPA_CAP)


def _evenly(count: int, limit: int) -> torch.Tensor:
    """At most ``limit`` indices spread evenly over range(count)."""
    if count <= limit:
        return torch.arange(count)
    return torch.linspace(0, count - 1, limit).round().long()


def _token_matrix(output) -> torch.Tensor:
    """(B, N, C) tokens from a patch embedding's output: (B, N, C), (B, H, W, C) or (x, hw_shape)."""
    tokens = output[0] if isinstance(output, (tuple, list)) else output
    return tokens.reshape(tokens.shape[0], -1, tokens.shape[-1])


def find_attention_modules(backbone: nn.Module) -> List[Tuple[str, nn.Module]]:
    """Attention modules that follow mmdet/mmpretrain conventions: a ``softmax`` nn.Softmax module, a
    ``qkv`` Linear producing q, k, v (in that order) and an output projection ``proj``."""
    return [(name, module) for name, module in backbone.named_modules()
            if isinstance(getattr(module, 'softmax', None), nn.Softmax)
            and isinstance(getattr(module, 'qkv', None), nn.Linear)
            and isinstance(getattr(module, 'proj', None), nn.Linear)]


class ConditioningProbe:
    """Forward hooks on a backbone that measure kappa of what its transformer computes.

    Recorded per forward pass while :attr:`active` (each quantity per image/window/head, reduced to mean
    and max):

    - ``tokens_in/stage{i}``, ``tokens_out/stage{i}``: kappa of each image's token matrix before and after
      the TokenConditioner of stage i (stage 0: the patch embedding). A backbone without a conditioner
      at the patch embedding reports its patch-embedding output as both.
    - ``attn_softmax/layer{j}``: kappa of the softmax attention matrix of each head and window.
    - ``attn_out/layer{j}``: kappa of each head's attention output A(X) = softmax(.) V (tokens x head dim).
    - ``w_q/layer{j}``, ``w_k/layer{j}``, ``w_v/layer{j}``: kappa of the projection weights.

    Args:
        backbone (nn.Module): the model's backbone.
        max_matrices (int): attention matrices per layer and forward pass used for kappa (windows are
            subsampled evenly; all heads of a chosen window are used). Default: 32.
        max_attention_tokens (int): attention matrices larger than this (global attention at high
            resolution: 4096 x 4096 for ViT-B at 1024) are skipped for ``attn_softmax`` because one
            float64 SVD of them costs seconds on a CPU. Default: 1024.
    """

    def __init__(self, backbone: nn.Module, max_matrices: int = 32, max_attention_tokens: int = 1024):
        self.max_matrices = max_matrices
        self.max_attention_tokens = max_attention_tokens
        self.active = False
        self.values: Dict[str, List[torch.Tensor]] = defaultdict(list)
        self._handles = []
        self.attention_layers = find_attention_modules(backbone)
        conditioners = [(name, m) for name, m in backbone.named_modules()
                        if isinstance(m, TokenConditioner)]
        for name, conditioner in conditioners:
            stage = self._stage_of(name)
            self._handles.append(conditioner.register_forward_hook(self._conditioner_hook(stage)))
        patch_embed = getattr(backbone, 'patch_embed', None)
        if patch_embed is not None and 0 not in {self._stage_of(n) for n, _ in conditioners}:
            self._handles.append(patch_embed.register_forward_hook(self._patch_embed_hook))
        for index, (_, attention) in enumerate(self.attention_layers):
            self._handles.append(attention.softmax.register_forward_hook(self._softmax_hook(index)))
            self._handles.append(attention.proj.register_forward_pre_hook(self._proj_hook(index)))
        self._skipped_large_attention = False

    @staticmethod
    def _stage_of(name: str) -> int:
        """'conditioners.2' -> 2; a single conditioner (e.g. 'conditioner') conditions stage 0."""
        last = name.rsplit('.', 1)[-1]
        return int(last) if last.isdigit() else 0

    def _add(self, key: str, kappas: torch.Tensor) -> None:
        self.values[key].append(kappas.reshape(-1).cpu())

    def _conditioner_hook(self, stage: int):
        def hook(module, args, output):
            if self.active:
                with torch.no_grad():
                    self._add(f'tokens_in/stage{stage}', _kappa(args[0]))
                    self._add(f'tokens_out/stage{stage}', _kappa(output))
        return hook

    def _patch_embed_hook(self, module, args, output):
        if self.active:
            with torch.no_grad():
                kappa = _kappa(_token_matrix(output))
                self._add('tokens_in/stage0', kappa)
                self._add('tokens_out/stage0', kappa)

    def _softmax_hook(self, index: int):
        def hook(module, args, attn):
            if not self.active:
                return
            tokens = attn.shape[-1]
            if tokens > self.max_attention_tokens:
                if not self._skipped_large_attention:
                    print_log(f'AttentionConditioningHook: attention matrices of {tokens} tokens are '
                              f'larger than max_attention_tokens={self.max_attention_tokens}; their '
                              'softmax kappa is not recorded (raise the limit to include them).',
                              logger='current', level=logging.WARNING)
                    self._skipped_large_attention = True
                return
            with torch.no_grad():
                chosen = attn[_evenly(attn.shape[0], max(1, self.max_matrices // attn.shape[1]))]
                self._add(f'attn_softmax/layer{index:02d}', _kappa(chosen.reshape(-1, tokens, tokens)))
        return hook

    def _proj_hook(self, index: int):
        def hook(module, args):
            if not self.active:
                return
            attention = self.attention_layers[index][1]
            heads = attention.num_heads
            x = args[0]  # (B*, ..., C): the heads' outputs concatenated, before the projection
            x = x.reshape(x.shape[0], -1, heads, x.shape[-1] // heads)
            with torch.no_grad():
                chosen = x[_evenly(x.shape[0], max(1, self.max_matrices // heads))]
                per_head = chosen.permute(0, 2, 1, 3).reshape(-1, x.shape[1], x.shape[-1])
                self._add(f'attn_out/layer{index:02d}', _kappa(per_head))
                weight = attention.qkv.weight.detach()
                for name, part in zip(('w_q', 'w_k', 'w_v'), weight.chunk(3, dim=0)):
                    self._add(f'{name}/layer{index:02d}', _kappa(part.unsqueeze(0)))
        return hook

    def reduce(self) -> Dict[str, float]:
        """Mean and max of every recorded quantity over what was captured, across ranks; then reset."""
        scalars = {}
        keys = sorted(self.values)
        if keys:
            stats = torch.stack([torch.stack([torch.cat(self.values[k]).sum(),
                                              torch.tensor(float(sum(v.numel() for v in self.values[k]))),
                                              torch.cat(self.values[k]).max()]) for k in keys])
            if get_world_size() > 1:  # every rank records the same layers in the same order
                sums = stats[:, :2].clone()
                maxima = stats[:, 2].clone()
                all_reduce(sums, op='sum')
                all_reduce(maxima, op='max')
                stats = torch.cat([sums, maxima[:, None]], dim=1)
            for key, (total, count, maximum) in zip(keys, stats.tolist()):
                quantity, where = key.split('/')
                scalars[f'kappa/{quantity}_mean/{where}'] = total / count
                scalars[f'kappa/{quantity}_max/{where}'] = maximum
        self.values.clear()
        return scalars

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []


@HOOKS.register_module()
class AttentionConditioningHook(Hook):
    """Record kappa of the embedded tokens and of every attention layer every ``interval`` iterations.

    The values (see :class:`ConditioningProbe` for the list) go to the text log, to every visualizer
    backend (``vis_data/scalars.json``; TensorBoard when ``TensorboardVisBackend`` is configured) under
    ``kappa/<quantity>_{mean,max}/<stage or layer>``, and are reduced across ranks in distributed runs.
    Recording only reads activations and weights (no RNG, no in-place change), so training is unchanged.

    Args:
        interval (int): record on every ``interval``-th training iteration (and the first). Default: 50.
            tools/benchmark/hook_overhead.py measures the cost: for Swin-T at 800x1344 (B=2, 2 idle CPU
            cores) one recording took 0.95 s against a 12.7 s backbone step, i.e. at most 0.15 % of
            training at 50 (7.5 % if recorded every iteration).
        max_matrices (int): attention matrices per layer used at each recording. Default: 32.
        max_attention_tokens (int): skip softmax kappa of larger attention matrices. Default: 1024.
        log_layers (bool): print the per-layer table in the text log, not only the summary line.
            Default: True.
    """

    priority = 'NORMAL'

    def __init__(self, interval: int = 50, max_matrices: int = 32, max_attention_tokens: int = 1024,
                 log_layers: bool = True):
        if not isinstance(interval, int) or interval < 1:
            raise ValueError(f'AttentionConditioningHook: interval={interval!r} is invalid; use an int >= 1')
        self.interval = interval
        self.max_matrices = max_matrices
        self.max_attention_tokens = max_attention_tokens
        self.log_layers = log_layers
        self.probe: Optional[ConditioningProbe] = None

    def before_train(self, runner) -> None:
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        backbone = getattr(model, 'backbone', model)
        self.probe = ConditioningProbe(backbone, self.max_matrices, self.max_attention_tokens)
        if not self.probe.attention_layers:
            print_log(f'AttentionConditioningHook: no attention module with softmax/qkv/proj found in '
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
        runner.logger.info(format_conditioning(scalars, step, self.log_layers))

    def after_train(self, runner) -> None:
        self.probe.remove()


def format_conditioning(scalars: Dict[str, float], step: int, per_layer: bool = True) -> str:
    """A summary line (token kappa; attention kappa averaged over layers) and an optional layer table."""
    def value(key):
        return scalars.get(key, math.nan)

    stages = sorted({k.rsplit('/', 1)[1] for k in scalars if k.startswith('kappa/tokens_in_mean/')})
    layers = sorted({k.rsplit('/', 1)[1] for k in scalars if k.startswith('kappa/attn_out_mean/')})
    parts = [f'{s} tokens kappa {value(f"kappa/tokens_in_mean/{s}"):.3g} -> '
             f'{value(f"kappa/tokens_out_mean/{s}"):.3g}' for s in stages]
    for quantity in ('attn_softmax', 'attn_out'):
        means = [value(f'kappa/{quantity}_mean/{layer}') for layer in layers]
        means = [m for m in means if not math.isnan(m)]
        if means:
            parts.append(f'{quantity} kappa (mean over layers) {sum(means) / len(means):.3g}')
    lines = [f'Iter(train) [{step}] conditioning: ' + ' | '.join(parts)]
    if per_layer and layers:
        columns = ('attn_softmax_mean', 'attn_softmax_max', 'attn_out_mean', 'attn_out_max', 'w_q_mean',
                   'w_k_mean', 'w_v_mean')
        lines.append('    layer   ' + ' '.join(f'{c:>17}' for c in columns))
        for layer in layers:
            lines.append(f'    {layer} ' + ' '.join(f'{value(f"kappa/{c}/{layer}"):17.4g}' for c in columns))
    return '\n'.join(lines)
