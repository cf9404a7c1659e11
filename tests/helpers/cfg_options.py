"""The --cfg-options of the tests' short training runs, and how the tools parse them."""
import argparse
import os.path as osp

from mmengine.config import DictAction


def data_options(root, max_epochs):
    """--cfg-options that point the demo config at a shapes dataset and make a short, quiet CPU run."""
    ann = osp.join(root, 'annotations', 'instances_{}.json')
    return [
        f'train_dataloader.dataset.data_root={root}/', f'val_dataloader.dataset.data_root={root}/',
        f'test_dataloader.dataset.data_root={root}/', f'val_evaluator.ann_file={ann.format("val")}',
        f'test_evaluator.ann_file={ann.format("val")}', f'train_cfg.max_epochs={max_epochs}',
        f'train_cfg.val_interval={max_epochs}', 'train_dataloader.num_workers=0',
        'train_dataloader.persistent_workers=False', 'val_dataloader.num_workers=0',
        'val_dataloader.persistent_workers=False', 'test_dataloader.num_workers=0',
        'test_dataloader.persistent_workers=False', 'default_hooks.checkpoint.interval=1',
        'default_hooks.logger.interval=1', 'randomness.seed=0'
    ]


def cfg_options_dict(options):
    """--cfg-options strings as the dict the tools merge into the config (parsed as by DictAction)."""
    parser = argparse.ArgumentParser()
    parser.add_argument('--cfg-options', nargs='+', action=DictAction)
    return parser.parse_args(['--cfg-options', *options]).cfg_options
