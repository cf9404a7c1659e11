"""The cells of a suite: one (variant, learning rate, seed) each, with its work dir, options and the checkpoint
its training ends with."""
import argparse
import copy
import functools
import os.path as osp
from dataclasses import dataclass, field
from typing import List, Optional

from mmengine.config import Config, DictAction

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
        test_options (list[str]): more --cfg-options for its test command only (a reported cell's held-out split).
        checkpoint (str): the checkpoint its training ends with (set by :func:`cells_of_stage`).
        resume (bool): train with --resume (an interrupted cell).
        status (str, optional): 'ran', 'failed', 'reused' (finished before), 'missing' (--gather-only) or
            'unreadable' (a cut-off file, named in its results).
        returncode (int, optional): the exit code of its last command.
        wall_s (float, optional): the seconds its commands took.
        log (str, optional): the log of its last command.
        results (dict, optional): what its files say (:func:`~condtok_mm.suites.results.cell_results`).
        fingerprint (dict, optional): what defines it (:mod:`~condtok_mm.suites.fingerprint`), recorded in
            its work dir when it starts.
        warmup (int): the iteration its warm-up ends (from its config), where plateau escape is looked for.
    """
    variant: str
    lr: float
    seed: int
    work_dir: str
    config: str
    config_path: str
    options: List[str] = field(default_factory=list)
    test_options: List[str] = field(default_factory=list)
    checkpoint: Optional[str] = None
    resume: bool = False
    status: Optional[str] = None
    returncode: Optional[int] = None
    wall_s: Optional[float] = None
    log: Optional[str] = None
    results: Optional[dict] = None
    fingerprint: Optional[dict] = None
    warmup: int = 0

    def to_json(self):
        record = {key: getattr(self, key) for key in JSON_FIELDS}
        if self.test_options:  # a reported cell of a suite with a held-out split
            record['test_options'] = list(self.test_options)
        return record

    @classmethod
    def from_json(cls, record):
        """A cell of suite.json's ``cells_detail`` (fields it does not keep stay at their defaults)."""
        return cls(config='', config_path='', test_options=list(record.get('test_options') or []),
                   **{key: record.get(key) for key in JSON_FIELDS})


def lr_name(lr):
    return f'lr{lr:g}'


def make_cell(suite, variant, lr, seed, out_dir, cfg_options):
    entry = suite.variants[variant]
    options = [f'randomness.seed={seed}', f'{suite.lr_key}={lr!r}', *suite.options, *entry.options, *cfg_options]
    return Cell(variant=variant, lr=lr, seed=seed, work_dir=osp.join(out_dir, variant, lr_name(lr), f'seed{seed}'),
                options=options, config=entry.config, config_path=entry.config_path)


@functools.lru_cache(maxsize=None)
def parsed_config(config_path):
    """The config file read once per run (its _base_ chain is what takes the time)."""
    return Config.fromfile(config_path, import_custom_modules=False)


def resolved_config(config_path, options):
    """A config after --cfg-options ``options`` (KEY=VALUE strings), as tools/train.py reads it."""
    cfg = copy.deepcopy(parsed_config(config_path))
    if options:
        parser = argparse.ArgumentParser()
        parser.add_argument('--cfg-options', nargs='+', action=DictAction)
        cfg.merge_from_dict(parser.parse_args(['--cfg-options', *options]).cfg_options)
    return cfg


def final_checkpoint(cfg, work_dir):
    """The checkpoint a training with ``cfg`` ends with (epoch- or iteration-based)."""
    train_cfg = cfg.train_cfg
    if 'max_epochs' in train_cfg and train_cfg.get('by_epoch', True) and 'max_iters' not in train_cfg:
        return osp.join(work_dir, f'epoch_{train_cfg.max_epochs}.pth')
    return osp.join(work_dir, f'iter_{train_cfg.max_iters}.pth')


def warmup_iters(cfg):
    """The iteration ``cfg``'s warm-up ends: the end of its first iteration-based LinearLR (0 without one)."""
    for scheduler in cfg.get('param_scheduler') or []:
        if isinstance(scheduler, dict) and scheduler.get('type') == 'LinearLR' and not scheduler.get('by_epoch', True):
            return int(scheduler.get('end', 0))
    return 0


def chosen_lr(suite, cells, name):
    """The rate a variant is reported at: its only rate, its source's (best_of), or the best mean metric among
    its rates on the selection seeds (on the reported seeds in a suite without them); None while unknown."""
    variant = suite.variants[name]
    if variant.best_of:
        return chosen_lr(suite, cells, variant.best_of)
    if not variant.tuned:
        return variant.lrs[0]
    return best_lr(cells, name, suite.metric, seeds=suite.selection_seeds or suite.seeds)


# each phase: the selection seeds at every rate, one more rate on them where the suite extends a best rate at the top
# of its grid, then the reported seeds
STAGES = ('select', 'extend', 'report')


def extension(suite, cells, name):
    """The rate a variant adds on the selection seeds under ``extend_top``: twice its grid's top where that is its
    best rate there; None otherwise, or while no selection cell of it has finished."""
    variant = suite.variants[name]
    if not (suite.extend_top and variant.tuned):
        return None
    best = best_lr([cell for cell in cells if cell.lr in variant.lrs], name, suite.metric, seeds=suite.selection_seeds)
    return 2 * max(variant.lrs) if best is not None and best == max(variant.lrs) else None


def unfinished_selection(suite, cells, name):
    """None where the selection cells of variant ``name`` among ``cells`` all finished (each has its metric), else
    one line saying how many did not: a rate is chosen, or a grid extended, on every selection seed or not at
    all."""
    selection = [cell for cell in cells if cell.variant == name and cell.seed in suite.selection_seeds]
    finished = [cell for cell in selection if suite.metric in ((cell.results or {}).get('metrics') or {})]
    if len(finished) == len(selection):
        return None
    return (f'variant {name!r}: {len(selection) - len(finished)} of its {len(selection)} selection cells did not '
            'finish (failed, interrupted or unreadable), and its rate is chosen on all of them: run them again '
            '(--resume) before its reported seeds')


def cells_of_stage(suite, phase, stage, phases, cells, out_dir, cfg_options):
    """(cells, unknown) of one phase and stage, seed-major (a study cut short keeps whole seeds), each with its
    checkpoint and warm-up; ``cells`` are the earlier stages' (the chosen rates come from them), ``unknown``
    the variants whose rate they do not give yet, one line each.

    'select' runs every rate of a variant with several on the selection seeds (nothing in a suite without
    them); 'extend' adds a variant's :func:`extension` there; 'report' runs each variant on the reported seeds at
    its chosen rate, or, in a suite without selection seeds, at every rate (the chosen one is picked among them
    afterwards), with the suite's ``held_out`` options on its test command."""
    names = [name for name in suite.variants if phases[name] == phase]
    if stage == 'select':
        seeds, plan = suite.selection_seeds, {name: suite.variants[name].lrs for name in names
                                              if suite.variants[name].tuned}
    elif stage == 'extend':
        seeds, plan, unknown = suite.selection_seeds, {}, []
        for name in names:
            waiting = unfinished_selection(suite, cells, name) if suite.extend_top else None
            if waiting:
                unknown.append(waiting)
                continue
            lr = extension(suite, cells, name)
            if lr is not None:
                plan[name] = [lr]
    else:
        seeds, plan, unknown = suite.seeds, {}, []
        for name in names:
            variant = suite.variants[name]
            if variant.tuned and not suite.selection_seeds:
                plan[name] = variant.lrs
                continue
            waiting = unfinished_selection(suite, cells, variant.best_of or name)
            if waiting:
                unknown.append(waiting)
                continue
            lr = chosen_lr(suite, cells, name)
            if lr is None and variant.best_of:
                unknown.append(f'variant {name!r} takes the rate chosen for {variant.best_of!r}, which has no '
                               'finished cell yet')
            elif lr is None:
                unknown.append(f'variant {name!r} runs its reported seeds at the rate chosen on the selection seeds, '
                               'which have no finished cell yet')
            else:
                plan[name] = [lr]
    new = [make_cell(suite, name, lr, seed, out_dir, cfg_options)
           for seed in seeds for name in suite.variants if name in plan for lr in plan[name]]
    if stage == 'report':
        for cell in new:
            cell.test_options = list(suite.held_out)
    schedules = {}  # the schedule does not depend on the seed and rate: one config read per variant
    for cell in new:
        key = (cell.config, tuple(cell.options[2:]))
        if key not in schedules:
            cfg = resolved_config(cell.config_path, cell.options)
            schedules[key] = osp.basename(final_checkpoint(cfg, cell.work_dir)), warmup_iters(cfg)
        checkpoint, cell.warmup = schedules[key]
        cell.checkpoint = osp.join(cell.work_dir, checkpoint)
    return new, [] if stage == 'select' else unknown
