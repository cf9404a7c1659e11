"""Checks the tools run on a config and its checkpoint, so that failures read as instructions."""
import importlib.util
import logging
import os.path as osp
import re
from typing import List, Tuple

import torch
from mmengine.config import Config
from mmengine.hooks import Hook
from mmengine.logging import print_log
from mmengine.model import BaseTTAModel, is_model_wrapper
from torch import nn

from condtok_mm.datasets.shapes import SHAPE_CLASSES

DEMO_HINT = ('No COCO on this machine? `make demo` trains and evaluates the same kind of model on the '
             'embedded synthetic shapes dataset (configs/demo/).')


class DatasetNotFoundError(FileNotFoundError):
    """A dataset that a config needs is not on disk; the message says how to get it."""


def _dataset_cfgs(dataset_cfg) -> List[dict]:
    """The leaf datasets of a dataset config (through RepeatDataset/ClassBalancedDataset/ConcatDataset)."""
    if dataset_cfg is None:
        return []
    if 'datasets' in dataset_cfg:
        return [leaf for child in dataset_cfg['datasets'] for leaf in _dataset_cfgs(child)]
    if 'dataset' in dataset_cfg:
        return _dataset_cfgs(dataset_cfg['dataset'])
    return [dataset_cfg]


def _is_shapes_dataset(dataset_cfg: dict) -> bool:
    """Whether a dataset config reads the synthetic shapes dataset: its classes are the shapes' (the demo configs
    set them in metainfo), wherever its data_root points."""
    classes = tuple((dataset_cfg.get('metainfo') or {}).get('classes', ()))
    return classes in (SHAPE_CLASSES, ('background', *SHAPE_CLASSES))  # detection, segmentation


def _missing_message(split: str, dataset_cfg: dict, path: str) -> str:
    data_root = dataset_cfg.get('data_root') or ''
    dataset_type = dataset_cfg.get('type', 'the dataset')
    where = f"({split}: {dataset_type}, data_root='{data_root}')"
    if _is_shapes_dataset(dataset_cfg):
        out_dir = data_root or osp.dirname(osp.dirname(path)) or '.'  # data_root holds annotations/
        return (f'The synthetic shapes dataset is missing: {path} does not exist {where}.\nCreate it with '
                f'`python tools/dataset/make_shapes.py --out-dir {out_dir}` (or run `make demo`, which creates '
                'data/shapes/).')
    if 'coco' in data_root.lower() or 'coco' in str(dataset_type).lower():
        return (f'COCO not found: {path} does not exist {where}.\n'
                f'This config trains and evaluates on COCO 2017. Download it from https://cocodataset.org '
                f'and place it at {data_root or "data/coco/"} with annotations/instances_train2017.json, '
                'annotations/instances_val2017.json, train2017/ and val2017/ (a symlink is enough: '
                f'`mkdir -p data && ln -s /path/to/coco {data_root.rstrip("/") or "data/coco"}`).\n'
                + DEMO_HINT)
    return (f'Dataset file not found: {path} {where}. Check data_root and ann_file in the config, or override '
            'them with --cfg-options.')


def check_dataset_files(cfg: Config, splits=('train', 'val', 'test')) -> None:
    """Raise DatasetNotFoundError if an annotation file of the given dataloaders is missing.

    Args:
        cfg (Config): the full config.
        splits (Sequence[str]): which of ``{split}_dataloader`` to check.
    """
    for split in splits:
        loader = cfg.get(f'{split}_dataloader')
        if not loader:
            continue
        for dataset_cfg in _dataset_cfgs(loader.get('dataset')):
            ann_file = dataset_cfg.get('ann_file')
            if not ann_file:
                continue
            path = ann_file if osp.isabs(ann_file) else osp.join(dataset_cfg.get('data_root') or '',
                                                                 ann_file)
            if not osp.exists(path):
                raise DatasetNotFoundError(_missing_message(f'{split}_dataloader.dataset', dataset_cfg,
                                                            path))


def fall_back_from_amp_on_cpu(cfg: Config) -> None:
    """Switch AmpOptimWrapper to OptimWrapper when no GPU is present, with a warning.

    mmengine's AmpOptimWrapper asserts a CUDA/NPU/MLU/MUSA device, so a config that enables AMP (ViTDet's,
    or ``--amp``) would otherwise not run on a CPU at all. Mixed precision is a GPU speed optimization;
    training in float32 computes the same model.
    """
    optim_wrapper = cfg.get('optim_wrapper')
    if optim_wrapper is None or optim_wrapper.get('type') != 'AmpOptimWrapper':
        return
    if torch.cuda.is_available():
        return
    print_log('AMP needs a GPU and none is available: training in float32 with OptimWrapper instead.',
              logger='current', level=logging.WARNING)
    optim_wrapper.type = 'OptimWrapper'
    for amp_only_key in ('loss_scale', 'dtype', 'use_fsdp'):
        optim_wrapper.pop(amp_only_key, None)



class MissingExtraError(ImportError):
    """A config uses an optional dependency that is not installed; the message names the extra to install."""


def check_vis_backends(cfg: Config) -> None:
    """Raise MissingExtraError if the config's visualizer logs to TensorBoard and tensorboard is not installed.

    tensorboard is the extra ``condtok_mm[tensorboard]``: only configs with a ``TensorboardVisBackend`` need it.
    mmengine imports it when that backend first writes, after the model and data are built, and its message names
    neither condtok_mm nor the extra; checked here, the tools stop before building anything.
    """
    backends = (cfg.get('visualizer') or {}).get('vis_backends') or []
    names = [b['type'] if isinstance(b['type'], str) else b['type'].__name__ for b in backends]
    if any(name.split('.')[-1] == 'TensorboardVisBackend' for name in names) and \
            importlib.util.find_spec('tensorboard') is None:
        raise MissingExtraError('the config logs to TensorBoard (TensorboardVisBackend) and tensorboard is not '
                                'installed: pip install condtok_mm[tensorboard]')

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
