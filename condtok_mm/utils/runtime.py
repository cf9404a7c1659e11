"""Checks the tools run on a config before building the Runner, so that failures read as instructions."""
import logging
import os.path as osp
from typing import List

import torch
from mmengine.config import Config
from mmengine.logging import print_log

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


def _missing_message(split: str, dataset_cfg: dict, path: str) -> str:
    data_root = dataset_cfg.get('data_root') or ''
    if 'shapes' in data_root:
        return (f'The synthetic shapes dataset is missing: {path} does not exist ({split}, '
                f"data_root='{data_root}').\nCreate it with `python tools/dataset/make_shapes.py "
                f'--out-dir {data_root}` (or run `make demo`, which creates it).')
    if 'coco' in data_root.lower() or 'coco' in str(dataset_cfg.get('type', '')).lower():
        return (f'COCO not found: {path} does not exist ({split}, data_root=\'{data_root}\').\n'
                f'This config trains and evaluates on COCO 2017. Download it from https://cocodataset.org '
                f'and place it at {data_root or "data/coco/"} with annotations/instances_train2017.json, '
                'annotations/instances_val2017.json, train2017/ and val2017/ (a symlink is enough: '
                f'`mkdir -p data && ln -s /path/to/coco {data_root.rstrip("/") or "data/coco"}`).\n'
                + DEMO_HINT)
    return (f'Dataset file not found: {path} ({split}, data_root=\'{data_root}\'). Check data_root and '
            'ann_file in the config, or override them with --cfg-options.')


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
