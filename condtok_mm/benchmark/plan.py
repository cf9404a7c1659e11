"""The cells of a suite: one (variant, learning rate, seed) each, with its work dir, options and the checkpoint
its training ends with."""
import argparse
import os.path as osp
from dataclasses import dataclass, field
from typing import List, Optional

from mmengine.config import Config, DictAction

from .schema import SuiteError
from .statistics import best_lr

# The cell fields suite.json keeps, in its order
JSON_FIELDS = ('variant', 'lr', 'seed', 'work_dir', 'status', 'returncode', 'wall_s', 'results')


@dataclass
class Cell:
    """One training and test run of a suite.

    Args:
        variant (str): the variant's name.
        lr (float): its learning rate.
        seed (int): ``randomness.seed``.
        work_dir (str): OUT_DIR/VARIANT/lrLR/seedS.
        config (str): the config as the suite writes it.
        config_path (str): the file the tools are given.
        options (list[str]): its --cfg-options: seed, rate, the suite's, the variant's, the command line's.
        checkpoint (str): the checkpoint its training ends with (set by :func:`cells_of_phase`).
        resume (bool): train with --resume (an interrupted cell).
        status (str, optional): 'ran', 'failed', 'reused' (finished before) or 'missing' (--gather-only).
        returncode (int, optional): the exit code of its last command.
        wall_s (float, optional): the seconds its commands took.
        log (str, optional): the log of its last command.
        results (dict, optional): what its files say (:func:`~condtok_mm.benchmark.results.cell_results`).
    """
    variant: str
    lr: float
    seed: int
    work_dir: str
    config: str
    config_path: str
    options: List[str] = field(default_factory=list)
    checkpoint: Optional[str] = None
    resume: bool = False
    status: Optional[str] = None
    returncode: Optional[int] = None
    wall_s: Optional[float] = None
    log: Optional[str] = None
    results: Optional[dict] = None

    def to_json(self):
        return {key: getattr(self, key) for key in JSON_FIELDS}

    @classmethod
    def from_json(cls, record):
        """A cell of suite.json's ``cells_detail`` (fields it does not keep stay at their defaults)."""
        return cls(config='', config_path='', **{key: record.get(key) for key in JSON_FIELDS})


def lr_name(lr):
    return f'lr{lr:g}'


def make_cell(suite, variant, lr, seed, out_dir, cfg_options):
    entry = suite.variants[variant]
    options = [f'randomness.seed={seed}', f'{suite.lr_key}={lr!r}', *suite.options, *entry.options, *cfg_options]
    return Cell(variant=variant, lr=lr, seed=seed, work_dir=osp.join(out_dir, variant, lr_name(lr), f'seed{seed}'),
                options=options, config=entry.config, config_path=entry.config_path)


def resolved_config(config_path, options):
    """A config after --cfg-options ``options`` (KEY=VALUE strings), as tools/train.py reads it."""
    cfg = Config.fromfile(config_path, import_custom_modules=False)
    if options:
        parser = argparse.ArgumentParser()
        parser.add_argument('--cfg-options', nargs='+', action=DictAction)
        cfg.merge_from_dict(parser.parse_args(['--cfg-options', *options]).cfg_options)
    return cfg


def final_checkpoint(cell):
    """The checkpoint the cell's training ends with, from its resolved config (epoch- or iteration-based)."""
    train_cfg = resolved_config(cell.config_path, cell.options).train_cfg
    if 'max_epochs' in train_cfg and train_cfg.get('by_epoch', True) and 'max_iters' not in train_cfg:
        return osp.join(cell.work_dir, f'epoch_{train_cfg.max_epochs}.pth')
    return osp.join(cell.work_dir, f'iter_{train_cfg.max_iters}.pth')


def cells_of_phase(suite, phase, phases, cells, out_dir, cfg_options):
    """The cells of one phase, seed-major (a study cut short keeps whole seeds), each with its checkpoint;
    ``cells`` are the earlier phases' (a best_of variant takes its source's best rate among them)."""
    new = []
    for seed in suite.seeds:
        for name, variant in suite.variants.items():
            if phases[name] != phase:
                continue
            lrs = variant.lrs
            if variant.best_of:
                lr = best_lr(cells, variant.best_of, suite.metric)
                if lr is None:
                    raise SuiteError(f'variant {name!r} takes the best rate of {variant.best_of!r}, '
                                     'which has no finished cell')
                lrs = [lr]
            new += [make_cell(suite, name, lr, seed, out_dir, cfg_options) for lr in lrs]
    schedules = {}  # the schedule does not depend on the seed and rate: one config read per variant
    for cell in new:
        key = (cell.config, tuple(cell.options[2:]))
        if key not in schedules:
            schedules[key] = osp.basename(final_checkpoint(cell))
        cell.checkpoint = osp.join(cell.work_dir, schedules[key])
    return new
