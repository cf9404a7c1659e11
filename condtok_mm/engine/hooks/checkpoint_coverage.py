"""tools/test.py's check that a checkpoint is one of the model it evaluates: it stops when the checkpoint leaves
more than a small share of the model's parameters unloaded, so that a mixed-up checkpoint does not evaluate as a
randomly initialised model."""
import re
from typing import List, Tuple

import torch
from mmengine.hooks import Hook
from mmengine.model import BaseTTAModel, is_model_wrapper
from torch import nn


# tools/test.py refuses a checkpoint that leaves more than this share of the model's parameters (counted in
# elements) unloaded: missing from the checkpoint or of another shape there. A checkpoint of the same
# architecture covers every parameter (a conditioned model and its baseline twin have the same parameters: the
# conditioner has none); one of another model, or a backbone-only one, leaves the neck and heads or the backbone
# (tens of percent) random.
PARTIAL_CHECKPOINT_LIMIT = 0.01


class PartialCheckpointError(RuntimeError):
    """A checkpoint leaves more than :data:`PARTIAL_CHECKPOINT_LIMIT` of the model's parameters unloaded."""


class MalformedCheckpointError(ValueError):
    """A checkpoint whose state dict (its 'state_dict', or itself) is not a dict of names to tensors."""


def checkpoint_state_dict(checkpoint, checkpoint_name: str) -> dict:
    """The state dict Runner.load_checkpoint would load from ``checkpoint`` (its 'state_dict', or itself); raises
    :class:`MalformedCheckpointError` naming the checkpoint where that is not a dict of names to tensors, where
    mmengine would fail with an AttributeError or TypeError deep in its loader."""
    state_dict = checkpoint.get('state_dict', checkpoint) if isinstance(checkpoint, dict) else checkpoint
    where = "its 'state_dict'" if isinstance(checkpoint, dict) and 'state_dict' in checkpoint else 'it'
    if not isinstance(state_dict, dict):
        raise MalformedCheckpointError(
            f'the checkpoint {checkpoint_name} is not a checkpoint of a model: {where} is a '
            f'{type(state_dict).__name__}, where a dict of parameter names to tensors (mmengine saves one under '
            "'state_dict') is needed; give the epoch_N.pth a training run wrote, or a published one")
    malformed = [f'{key!r}: {type(value).__name__}' for key, value in state_dict.items()
                 if not isinstance(key, str) or not isinstance(value, torch.Tensor)]
    if malformed:
        raise MalformedCheckpointError(
            f'the checkpoint {checkpoint_name} is not a checkpoint of a model: {len(malformed)} entries of {where} '
            f'are not parameter names with tensors (e.g. {", ".join(malformed[:3])}); give the epoch_N.pth a '
            'training run wrote, or a published one')
    return state_dict


def saved_parameters(model: nn.Module) -> dict:
    """{name: parameter} under the names the model's state dict gives them: its state-dict hooks included (our
    wrappers, e.g. SpectralAttentionBackbone, save the wrapped backbone's keys, not `wrapped.`'s)."""
    return {name: value for name, value in model.state_dict(keep_vars=True).items()
            if isinstance(value, nn.Parameter)}


def unloaded_parameters(model: nn.Module, checkpoint: dict) -> Tuple[List[str], List[Tuple[str, tuple, tuple]]]:
    """The parameters of ``model`` that loading ``checkpoint`` as Runner.load_checkpoint does leaves unloaded.

    The state dict and key revision are those of mmengine 0.10.7 (runner/checkpoint.py L592-602: the checkpoint's
    'state_dict', or the checkpoint itself, with a leading 'module.' removed).

    Returns:
        tuple[list[str], list[tuple[str, tuple, tuple]]]: the names missing from the checkpoint, and the
        (name, model shape, checkpoint shape) of those of another shape there.
    """
    state_dict = checkpoint_state_dict(checkpoint, 'given')
    state_dict = {re.sub(r'^module\.', '', key): value for key, value in state_dict.items()}
    missing, mismatched = [], []
    for name, parameter in saved_parameters(model).items():
        if name not in state_dict:
            missing.append(name)
        elif tuple(state_dict[name].shape) != tuple(parameter.shape):
            mismatched.append((name, tuple(parameter.shape), tuple(state_dict[name].shape)))
    return missing, mismatched


def check_checkpoint_covers_model(model: nn.Module, checkpoint: dict, checkpoint_name: str, config_name: str,
                                  limit: float = PARTIAL_CHECKPOINT_LIMIT) -> None:
    """Raise PartialCheckpointError if ``checkpoint`` leaves more than ``limit`` of ``model``'s parameters
    (in elements) unloaded; the message names the counts, a few keys, the checkpoint and the config. A checkpoint
    that is not one of a model raises :class:`MalformedCheckpointError` whatever the limit."""
    checkpoint_state_dict(checkpoint, checkpoint_name)
    if limit >= 1:
        return
    missing, mismatched = unloaded_parameters(model, checkpoint)
    shapes = saved_parameters(model)
    total = sum(parameter.numel() for parameter in shapes.values())
    unloaded = sum(shapes[name].numel() for name in missing) + sum(shapes[name].numel() for name, *_ in mismatched)
    if total == 0 or unloaded / total <= limit:
        return
    parts = []
    if missing:
        parts.append(f'{len(missing)} of its {len(shapes)} parameter tensors are missing from the checkpoint '
                     f'(e.g. {", ".join(missing[:3])})')
    if mismatched:
        examples = ', '.join(f'{name}: {list(model_shape)} in the model, {list(checkpoint_shape)} in the checkpoint'
                             for name, model_shape, checkpoint_shape in mismatched[:3])
        parts.append(f'{len(mismatched)} have another shape in it (e.g. {examples})')
    raise PartialCheckpointError(
        f'the checkpoint {checkpoint_name} leaves {unloaded:,} of the {total:,} parameters '
        f'({100 * unloaded / total:.1f}%) of the model of {config_name} unloaded: {"; ".join(parts)}. Those '
        'parameters would keep their random initial values. Is it a checkpoint of this config? tools/test.py stops '
        f'when more than {limit:.0%} of the parameters are left unloaded; pass --allow-partial-checkpoint to '
        'evaluate it anyway.')


class CheckpointCoverageCheck(Hook):
    """Runs :func:`check_checkpoint_covers_model` on the checkpoint the runner loads, before it loads it.

    Args:
        checkpoint_name (str): the checkpoint as the user gave it (a path or URL), for the message.
        config_name (str): the config file, for the message.
        limit (float): the largest share of the parameters it may leave unloaded; 1 checks only that it is a
            checkpoint of a model. Default: :data:`PARTIAL_CHECKPOINT_LIMIT`.
    """

    def __init__(self, checkpoint_name: str, config_name: str, limit: float = PARTIAL_CHECKPOINT_LIMIT):
        self.checkpoint_name = checkpoint_name
        self.config_name = config_name
        self.limit = limit

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        # Runner.load_checkpoint (runner/runner.py L2127-2138) calls this hook between reading the checkpoint and
        # loading it into the model, which it unwraps as here (and mmengine's load_state_dict a TTA model)
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        if isinstance(model, BaseTTAModel):
            model = model.module
        check_checkpoint_covers_model(model, checkpoint, self.checkpoint_name, self.config_name, self.limit)
