"""Whether the files a config's datasets read are there, checked before anything is built, so that a missing
dataset reads as what to do: make the demo's data or get COCO."""
import os.path as osp
from typing import List

from mmengine.config import Config

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
