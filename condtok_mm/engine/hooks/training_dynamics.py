"""Record how training moves through a transformer backbone: per block, the residual stream, the relative size
of its attention and MLP updates, the attention entropy and the gradient norm."""
import math
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn as nn
from mmengine.dist import all_reduce, get_world_size
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper
from mmengine.optim import OptimWrapperDict

from condtok_mm.models.layout import block_norms, find_attention_modules, find_residual_blocks
from condtok_mm.registry import HOOKS

BLOCK_QUANTITIES = ('stream_rms', 'attn_update_ratio', 'mlp_update_ratio', 'attn_entropy', 'grad_norm')
# per block: sums reduced across ranks before the ratios are taken
_SUMS = ('stream_sq', 'stream_count', 'attn_update_sq', 'mlp_stream_sq', 'mlp_update_sq', 'entropy_sum',
         'entropy_count')


class _BlockRecording:
    """What one block's forward hooks capture during one recording iteration.

    The three hook points come in a fixed order (norm1 input, norm2 input, block output); ``stage`` says which
    one is awaited, so that a second forward of the block in the same iteration (activation checkpointing
    recomputing it in backward) is ignored.
    """

    def __init__(self):
        self.stage = 'norm1'
        self.stream: Optional[torch.Tensor] = None  # the stream entering the branch being run
        self.sums = dict.fromkeys(_SUMS, 0.0)


def _sum_sq(tensor: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(tensor, dtype=torch.float64)**2)


@HOOKS.register_module()
class TrainingDynamicsHook(Hook):
    """Record, every ``interval`` training iterations, how each transformer block of the backbone is trained.

    A block is a pre-norm residual block ``x -> x + a(norm1(x)) -> (.) + m(norm2(.))`` (Swin's and ViT's,
    found by :func:`condtok_mm.models.layout.find_residual_blocks`). Written to every visualizer backend
    (``vis_data/scalars.json``) at step ``iteration + 1`` (mmengine's logged iteration), per block (``<block>``
    its module path):

    - ``dynamics/stream_rms/<block>``: the root mean square of the residual stream entering the block (its
      norm1 input).
    - ``dynamics/attn_update_ratio/<block>``: ||a|| / ||x||, the attention branch's update as it is added to
      the stream (drop path included) relative to the stream it is added to, measured as the norm2 input
      minus the norm1 input.
    - ``dynamics/mlp_update_ratio/<block>``: ||m|| / ||x + a||, the MLP branch's update (block output minus
      norm2 input) relative to the stream entering the MLP branch.
    - ``dynamics/attn_entropy/<block>``: the entropy -sum_k p log p (nats; at most log(number of keys)) of
      every attention row, averaged over heads, windows and query tokens; from the output of the attention's
      ``softmax`` module (mmdet/mmpretrain Swin, ViTDet).
    - ``dynamics/grad_norm/<block>``: the L2 norm of the gradient of the block's parameters.

    and for the whole model: ``dynamics/grad_norm_total`` (all parameters with a gradient),
    ``dynamics/loss`` (the iteration's total loss) and ``dynamics/loss_smoothed`` (its mean over the last
    ``interval`` iterations, from the message hub, so less noisy to compare).

    Norms and means run over every token of the batch, padding included (the padding of images to a common
    size, and of windows to a multiple of the window size). Gradients are read just before the optimizer
    step: after the distributed all-reduce, unscaled under AMP, but after clipping when the optim wrapper
    clips (mmengine then logs the unclipped total as ``grad_norm``); an iteration whose step is skipped
    (AMP overflow, gradient accumulation) records no gradient norms. Activations are recorded on the first
    forward of each block in the iteration. In distributed runs the activation statistics are sums over all
    ranks' batches; the loss is this rank's.

    Nothing runs outside a recording iteration: the forward hooks and the optimizer's step pre-hook are
    registered in ``before_train_iter`` of a recording iteration and removed in its ``after_train_iter``.
    Recording only reads tensors, so training is unchanged.

    Args:
        interval (int): record on every ``interval``-th training iteration, and on the first. Default: 10.
        log_blocks (bool): also print a per-block table in the text log, not only the summary line.
            Default: False.
    """

    priority = 'NORMAL'

    def __init__(self, interval: int = 10, log_blocks: bool = False):
        if not isinstance(interval, int) or isinstance(interval, bool) or interval < 1:
            raise ValueError(f'TrainingDynamicsHook: interval={interval!r} is invalid; use an int >= 1')
        self.interval = interval
        self.log_blocks = log_blocks
        self.blocks: List[Tuple[str, nn.Module]] = []
        self._model: Optional[nn.Module] = None
        self._handles = []
        self._recordings: Dict[str, _BlockRecording] = {}
        self._grad_sq: Optional[Dict[str, float]] = None

    def before_train(self, runner) -> None:
        self._model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        backbone = getattr(self._model, 'backbone', self._model)
        self.blocks = find_residual_blocks(backbone)
        if not self.blocks:
            raise ValueError(f'TrainingDynamicsHook: {type(backbone).__name__} has no pre-norm transformer '
                             'block (a module with norm1 and norm2, or ln1 and ln2, around an attention module '
                             'with softmax/qkv/proj); this hook records transformer backbones such as Swin and '
                             'ViT: remove it from custom_hooks for this model')

    def _records(self, runner) -> bool:
        return runner.iter == 0 or self.every_n_train_iters(runner, self.interval)

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        if self._records(runner):
            self._attach(runner)

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        if not self._handles:
            return
        self._detach()
        scalars = self._reduce()
        # RuntimeInfoHook (VERY_HIGH priority) has put this iteration's loss in the message hub already
        if 'train/loss' in runner.message_hub.log_scalars:
            losses = runner.message_hub.get_scalar('train/loss')
            scalars['dynamics/loss'] = float(losses.current())
            scalars['dynamics/loss_smoothed'] = float(losses.mean(self.interval))
        step = runner.iter + 1
        runner.visualizer.add_scalars(scalars, step=step)
        runner.logger.info(format_dynamics(scalars, step, [name for name, _ in self.blocks], self.log_blocks))

    def after_train(self, runner) -> None:
        self._detach()

    # recording --------------------------------------------------------------------------------------------

    def _attach(self, runner) -> None:
        self._recordings = {name: _BlockRecording() for name, _ in self.blocks}
        self._grad_sq = None
        for name, block in self.blocks:
            recording = self._recordings[name]
            norm1, norm2 = block_norms(block)
            self._handles += [
                norm1.register_forward_pre_hook(self._norm1_hook(recording)),
                norm2.register_forward_pre_hook(self._norm2_hook(recording)),
                block.register_forward_hook(self._block_output_hook(recording)),
            ]
            (_, attention), = find_attention_modules(block)
            self._handles.append(attention.softmax.register_forward_hook(self._softmax_hook(recording)))
        wrappers = runner.optim_wrapper.values() if isinstance(runner.optim_wrapper, OptimWrapperDict) \
            else [runner.optim_wrapper]
        for wrapper in wrappers:
            self._handles.append(wrapper.optimizer.register_step_pre_hook(self._gradient_hook))

    def _detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    @staticmethod
    def _norm1_hook(recording: _BlockRecording):
        def hook(norm, args):
            if recording.stage != 'norm1':
                return
            stream = args[0].detach()
            recording.sums['stream_sq'] += _sum_sq(stream)
            recording.sums['stream_count'] += stream.numel()
            recording.stream = stream
            recording.stage = 'norm2'
        return hook

    @staticmethod
    def _norm2_hook(recording: _BlockRecording):
        def hook(norm, args):
            if recording.stage != 'norm2':
                return
            stream = args[0].detach()
            # the attention update as it was added: (x + a) - x, exact up to the float rounding of the add
            recording.sums['attn_update_sq'] += _sum_sq(stream.double() - recording.stream.double())
            recording.sums['mlp_stream_sq'] += _sum_sq(stream)
            recording.stream = stream
            recording.stage = 'output'
        return hook

    @staticmethod
    def _block_output_hook(recording: _BlockRecording):
        def hook(block, args, output):
            if recording.stage != 'output':
                return
            output = output[0] if isinstance(output, (tuple, list)) else output
            recording.sums['mlp_update_sq'] += _sum_sq(output.detach().double() - recording.stream.double())
            recording.stream = None
            recording.stage = 'done'
        return hook

    @staticmethod
    def _softmax_hook(recording: _BlockRecording):
        def hook(softmax, args, probabilities):
            if recording.stage != 'norm2':  # only the attention of the block's first forward
                return
            # entr(p) = -p log p, 0 at p = 0; one entropy per attention row (query)
            rows = torch.special.entr(probabilities.detach()).sum(dim=-1, dtype=torch.float64)
            recording.sums['entropy_sum'] += float(rows.sum())
            recording.sums['entropy_count'] += rows.numel()
        return hook

    def _gradient_hook(self, optimizer, args, kwargs) -> None:
        if self._grad_sq is not None:  # a second optimizer of an OptimWrapperDict: the gradients are read
            return
        squares = {}
        for name, block in self.blocks:
            squares[name] = sum(_sum_sq(p.grad) for p in block.parameters() if p.grad is not None)
        squares['total'] = sum(_sum_sq(p.grad) for p in self._model.parameters() if p.grad is not None)
        self._grad_sq = squares

    def _reduce(self) -> Dict[str, float]:
        names = [name for name, _ in self.blocks]
        sums = torch.tensor([[self._recordings[name].sums[key] for key in _SUMS] for name in names],
                            dtype=torch.float64)
        if get_world_size() > 1:
            all_reduce(sums, op='sum')
        scalars = {}
        for name, row in zip(names, sums.tolist()):
            values = dict(zip(_SUMS, row))
            if values['stream_count'] == 0:  # the block did not run in this iteration
                continue
            stream_sq = values['stream_sq']
            scalars[f'dynamics/stream_rms/{name}'] = math.sqrt(stream_sq / values['stream_count'])
            scalars[f'dynamics/attn_update_ratio/{name}'] = _ratio(values['attn_update_sq'], stream_sq)
            scalars[f'dynamics/mlp_update_ratio/{name}'] = _ratio(values['mlp_update_sq'], values['mlp_stream_sq'])
            if values['entropy_count']:
                scalars[f'dynamics/attn_entropy/{name}'] = values['entropy_sum'] / values['entropy_count']
        if self._grad_sq is not None:
            for name in names:
                scalars[f'dynamics/grad_norm/{name}'] = math.sqrt(self._grad_sq[name])
            scalars['dynamics/grad_norm_total'] = math.sqrt(self._grad_sq['total'])
        self._recordings = {}
        self._grad_sq = None
        return scalars


def _ratio(update_sq: float, stream_sq: float) -> float:
    """||update|| / ||stream|| from their squares; nan for a zero stream."""
    return math.sqrt(update_sq / stream_sq) if stream_sq > 0 else math.nan


def format_dynamics(scalars: Dict[str, float], step: int, blocks: List[str], per_block: bool = False) -> str:
    """A summary line (loss, total gradient norm, first and last block) and an optional per-block table."""
    def value(key):
        return scalars.get(key, math.nan)

    line = (f'Iter(train) [{step}] dynamics: loss {value("dynamics/loss"):.4g}, grad norm '
            f'{value("dynamics/grad_norm_total"):.4g}')
    for block in dict.fromkeys((blocks[0], blocks[-1])):
        line += (f' | {block}: stream rms {value(f"dynamics/stream_rms/{block}"):.3g}, update/stream attn '
                 f'{value(f"dynamics/attn_update_ratio/{block}"):.3g} mlp '
                 f'{value(f"dynamics/mlp_update_ratio/{block}"):.3g}, attn entropy '
                 f'{value(f"dynamics/attn_entropy/{block}"):.3g}')
    if not per_block:
        return line
    lines = [line, '    ' + f'{"block":<20}' + ' '.join(f'{q:>17}' for q in BLOCK_QUANTITIES)]
    for block in blocks:
        lines.append(f'    {block:<20}' + ' '.join(f'{value(f"dynamics/{q}/{block}"):17.4g}' for q in BLOCK_QUANTITIES))
    return '\n'.join(lines)
