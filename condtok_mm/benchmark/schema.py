"""A suite file (configs/suites/*.py, an mmengine config) read into a checked :class:`Suite`.

The keys of a suite::

    variants = dict(NAME=dict(config=PATH, cfg_options={KEY: VALUE}, lrs=None | [LR, ...] | dict(best_of=NAME),
                              description=TEXT), ...)   # ordered; each a config plus --cfg-options
    reference = NAME        # the variant that paired differences are taken against
    seeds = [0, 1, 2]       # one run per seed; the same seed gives every variant the same initial weights
    lrs = [LR, ...]         # learning rates of the variants whose ``lrs`` is None
    lr_key = 'optim_wrapper.optimizer.lr'
    metric = 'coco/bbox_mAP'    # ranks the learning rates of a variant (best_of, the best-rate table)
    cfg_options = {KEY: VALUE}  # for every cell, before the variant's own
    _name = ...             # keys starting with _ are the file's own shorthands, ignored

A variant with ``lrs=dict(best_of=NAME)`` runs after NAME's cells, at NAME's learning rate with the best mean
``metric`` over seeds.
"""
import os.path as osp
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from mmengine.config import Config, ConfigDict

SUITE_KEYS = {'variants', 'reference', 'seeds', 'lrs', 'lr_key', 'metric', 'cfg_options', 'description'}
VARIANT_KEYS = {'config', 'cfg_options', 'lrs', 'description'}


class SuiteError(ValueError):
    """A suite file that cannot be run; the message names the key and the fix."""


@dataclass
class Variant:
    """One arm of a suite: a config and its options, at fixed rates or at another variant's best rate.

    Args:
        name (str): the variant's key in ``variants``.
        config (str): the config as the suite writes it (relative to the repository root, or ``mmdet::...``).
        config_path (str): the file tools/train.py is given.
        lrs (list[float]): its learning rates; empty when ``best_of`` is set.
        best_of (str, optional): the variant whose best rate it takes.
        options (list[str]): its ``cfg_options`` as --cfg-options ``KEY=VALUE`` strings.
        description (str): what it is, for the reader.
    """
    name: str
    config: str
    config_path: str
    lrs: List[float] = field(default_factory=list)
    best_of: Optional[str] = None
    options: List[str] = field(default_factory=list)
    description: str = ''


@dataclass
class Suite:
    """A checked suite file; ``root`` is the checkout (or installed ``.mim``) that holds configs/ and tools/."""
    path: str
    name: str
    root: str
    reference: str
    seeds: List[int]
    lrs: List[float]
    lr_key: str
    metric: str
    description: str
    options: List[str]
    variants: Dict[str, Variant]


def option_value(key, value, where):
    """A --cfg-options value as mmengine's DictAction reads it back."""
    if isinstance(value, (list, tuple)):
        return '[' + ','.join(option_value(key, item, where) for item in value) + ']'
    if isinstance(value, (dict, ConfigDict)):
        raise SuiteError(f'{where}: {key} is a dict; give its keys one by one ({key}.SUBKEY: VALUE)')
    if isinstance(value, str) and any(char in value for char in ',[]()" '):
        raise SuiteError(f'{where}: the value of {key} ({value!r}) has characters that --cfg-options cannot '
                         'carry; set it in the variant config instead')
    return str(value)


def options_list(options, where):
    if not isinstance(options, (dict, ConfigDict)):
        raise SuiteError(f'{where}: cfg_options must be a dict of KEY: VALUE, got {type(options).__name__}')
    return [f'{key}={option_value(key, value, where)}' for key, value in options.items()]


def resolve_config(config, root):
    """The file a variant's ``config`` names: a path relative to ``root``; ``mmdet::...`` is passed on as is."""
    return config if config.startswith('mmdet::') else osp.join(root, config)


def check_config(config, root, where):
    if not config.startswith('mmdet::') and not osp.isfile(osp.join(root, config)):
        raise SuiteError(f'{where}: config {config} does not exist (paths are relative to the repository root)')


def load_variant(name, variant, suite_lrs, names, root, where):
    if not isinstance(variant, dict) or 'config' not in variant:
        raise SuiteError(f'{where} needs a config: dict(config=PATH, ...)')
    unknown = set(variant) - VARIANT_KEYS
    if unknown:
        raise SuiteError(f'{where}: unknown key(s) {", ".join(sorted(unknown))}; a variant has '
                         f'{", ".join(sorted(VARIANT_KEYS))}')
    config = variant['config']
    check_config(config, root, where)
    lrs, best_of = variant.get('lrs'), None
    if lrs is None:
        if not suite_lrs:
            raise SuiteError(f'{where} has no lrs and the suite has no lrs')
        lrs = suite_lrs
    elif isinstance(lrs, dict):
        if set(lrs) != {'best_of'} or lrs['best_of'] not in names or lrs['best_of'] == name:
            raise SuiteError(f'{where}: lrs=dict(best_of=NAME) needs NAME, another variant of the suite; '
                             f'got {lrs!r}')
        lrs, best_of = [], lrs['best_of']
    elif not (isinstance(lrs, list) and lrs and all(isinstance(lr, (int, float)) and lr > 0 for lr in lrs)):
        raise SuiteError(f'{where}: lrs must be None, a list of positive rates or dict(best_of=NAME)')
    return Variant(name=name, config=config, config_path=resolve_config(config, root), lrs=list(lrs),
                   best_of=best_of, description=variant.get('description', ''),
                   options=options_list(variant.get('cfg_options', {}), f'{where}: cfg_options'))


def load_suite(path, root):
    """The suite file as a checked :class:`Suite`; raises SuiteError naming what is wrong."""
    if not osp.isfile(path):
        raise SuiteError(f'no suite file at {path}; suites live in configs/suites/')
    raw = {key: value for key, value in Config.fromfile(path, import_custom_modules=False).to_dict().items()
           if not key.startswith('_')}  # _name: the suite file's own shorthands
    unknown = set(raw) - SUITE_KEYS
    if unknown:
        raise SuiteError(f'{path}: unknown key(s) {", ".join(sorted(unknown))}; a suite has '
                         f'{", ".join(sorted(SUITE_KEYS))}')
    for key in ('variants', 'reference', 'seeds'):
        if key not in raw:
            raise SuiteError(f'{path}: the suite has no {key!r}')
    seeds = list(raw['seeds'])
    if not seeds or not all(isinstance(seed, int) for seed in seeds):
        raise SuiteError(f'{path}: seeds must be a non-empty list of integers, got {raw["seeds"]!r}')
    if not isinstance(raw['variants'], dict) or not raw['variants']:
        raise SuiteError(f'{path}: variants must be a non-empty dict of NAME=dict(config=..., ...)')
    suite_lrs = list(raw.get('lrs') or [])
    variants = {name: load_variant(name, variant, suite_lrs, raw['variants'], root, f'{path}: variant {name!r}')
                for name, variant in raw['variants'].items()}
    suite = Suite(path=path, name=osp.splitext(osp.basename(path))[0], root=root, reference=raw['reference'],
                  seeds=seeds, lrs=suite_lrs, lr_key=raw.get('lr_key', 'optim_wrapper.optimizer.lr'),
                  metric=raw.get('metric', 'coco/bbox_mAP'), description=raw.get('description', ''),
                  options=options_list(raw.get('cfg_options', {}), f'{path}: cfg_options'), variants=variants)
    if suite.reference not in suite.variants:
        raise SuiteError(f'{path}: reference {suite.reference!r} is not one of the variants '
                         f'({", ".join(suite.variants)})')
    phase_of(suite)  # a best_of cycle fails here
    return suite


def phase_of(suite):
    """{variant: phase}: 0 for fixed rates, 1 + the phase of the variant whose best rate it takes."""
    phases = {}

    def phase(name, seen=()):
        if name in seen:
            raise SuiteError(f'{suite.path}: best_of cycle {" -> ".join((*seen, name))}')
        if name not in phases:
            best_of = suite.variants[name].best_of
            phases[name] = 1 + phase(best_of, (*seen, name)) if best_of else 0
        return phases[name]

    for name in suite.variants:
        phase(name)
    return phases
