"""A suite file (configs/suites/*.py, an mmengine config) read into a checked :class:`Suite`.

The keys of a suite::

    variants = dict(NAME=dict(config=PATH, cfg_options={KEY: VALUE}, lrs=None | [LR, ...] | dict(best_of=NAME),
                              reference=NAME | None, description=TEXT), ...)
                            # ordered; each a config plus --cfg-options; ``reference``: its own baseline twin
                            # (default: the suite's), None: a baseline itself, compared with nothing
    reference = NAME        # the variant that paired differences are taken against
    seeds = [3, 4, 5]       # one run per seed (the reported seeds); the same seed gives every variant the same
                            # initial weights
    selection_seeds = [0, 1, 2]  # optional: the seeds a variant's rate is chosen on, then reported on ``seeds``
    lrs = [LR, ...]         # learning rates of the variants whose ``lrs`` is None
    lr_key = 'optim_wrapper.optimizer.lr'
    metric = 'coco/bbox_mAP'    # ranks the learning rates of a variant (best_of, the chosen-rate table)
    family = [NAME, ...]    # optional: the comparisons (variant vs its reference, ``metric``) Holm corrects over
    escape = dict(margin=0.2, window=5, after=None)  # optional: the plateau-escape rule (results.py)
    early_loss = 100        # optional: also report the mean training loss over iterations 1-100 of each run, paired
                            # like the metric (a loss spike in the first iterations shows there)
    held_out = {KEY: VALUE} # optional: --cfg-options for the test command of the reported cells only (a held-out
                            # test split); the selection cells' tests, which choose the rates, keep the config's
    extend_top = False      # optional: a variant whose best rate on the selection seeds is the top of its grid
                            # runs one more rate, twice that, on the selection seeds, before its rate is chosen
    cfg_options = {KEY: VALUE}  # for every cell, before the variant's own
    _name = ...             # keys starting with _ are the file's own shorthands, ignored

A variant with several rates runs each of them and is reported at the one with the best mean ``metric``:
chosen on ``selection_seeds`` (every rate runs there, the chosen one on ``seeds``), or, in a suite without
them, on the reported seeds themselves. A variant with ``lrs=dict(best_of=NAME)`` runs after NAME's cells, at
NAME's chosen rate.
"""
import math
import os.path as osp
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from mmengine.config import Config, ConfigDict
from mmengine.config.utils import MODULE2PACKAGE
from mmengine.utils import get_installed_path, is_installed

from .plan import lr_name

SUITE_KEYS = {'variants', 'reference', 'seeds', 'selection_seeds', 'lrs', 'lr_key', 'metric', 'family', 'escape',
              'early_loss', 'cfg_options', 'description', 'held_out', 'extend_top'}
VARIANT_KEYS = {'config', 'cfg_options', 'lrs', 'reference', 'description'}
ESCAPE_KEYS = {'margin', 'window', 'after'}
CONFIG_PACKAGES = ('mmdet', 'mmpretrain', 'mmseg')  # PACKAGE::PATH configs a variant may name


class SuiteError(ValueError):
    """A suite file that cannot be run; the message names the key and the fix."""


@dataclass
class Variant:
    """One arm of a suite: a config and its options, at fixed rates or at another variant's best rate.

    Args:
        name (str): the variant's key in ``variants``.
        config (str): the config as the suite writes it: relative to the repository root, or
            ``PACKAGE::PATH`` in an installed package (``mmdet::swin/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py``).
        config_path (str): the file the tools are given.
        lrs (list[float]): its learning rates; empty when ``best_of`` is set.
        best_of (str, optional): the variant whose best rate it takes.
        options (list[str]): its ``cfg_options`` as --cfg-options ``KEY=VALUE`` strings.
        reference (str, optional): the variant its paired differences are taken against; None for a reference.
        description (str): what it is, for the reader.
    """
    name: str
    config: str
    config_path: str
    lrs: List[float] = field(default_factory=list)
    best_of: Optional[str] = None
    options: List[str] = field(default_factory=list)
    reference: Optional[str] = None
    description: str = ''

    @property
    def tuned(self):
        """Whether its rate is chosen among several."""
        return not self.best_of and len(self.lrs) > 1


@dataclass
class EscapeRule:
    """When a run has left the loss plateau (:func:`~condtok_mm.suites.results.escape_iteration`).

    Args:
        margin (float): the smoothed loss must fall to (1 - margin) x the plateau level. Default: 0.2.
        window (int): logged losses in the trailing mean that smooths the curve. Default: 5.
        after (int, optional): the iteration the warm-up ends; None: from each cell's config (the end of its
            iteration-based LinearLR warm-up, 0 without one). Default: None.
    """
    margin: float = 0.2
    window: int = 5
    after: Optional[int] = None


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
    selection_seeds: List[int] = field(default_factory=list)
    family: List[str] = field(default_factory=list)
    escape: EscapeRule = field(default_factory=EscapeRule)
    early_loss: Optional[int] = None
    held_out: List[str] = field(default_factory=list)
    extend_top: bool = False

    def role(self, seed):
        """'selection' for a seed the rates are chosen on, 'report' for a reported one."""
        return 'selection' if seed in self.selection_seeds else 'report'


def option_value(key, value, where):
    """A --cfg-options value as mmengine's DictAction reads it back (a tuple stays a tuple: mmengine's
    dynamic_intervals must be a list of tuples)."""
    if isinstance(value, list):
        return '[' + ','.join(option_value(key, item, where) for item in value) + ']'
    if isinstance(value, tuple):
        return '(' + ','.join(option_value(key, item, where) for item in value) + (',)' if len(value) == 1 else ')')
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


def resolve_config(config, root, where='config'):
    """The file a variant's ``config`` names: a path relative to ``root``, or ``PACKAGE::PATH`` in an installed
    OpenMMLab package's configs (PACKAGE/.mim/configs/PATH, as mmengine resolves a ``_base_``); raises
    SuiteError when there is no such file."""
    package, sep, relative = config.partition('::')
    if not sep:
        path = osp.join(root, config)
        if not osp.isfile(path):
            raise SuiteError(f'{where}: config {config} does not exist (paths are relative to the repository root)')
        return path
    if package not in CONFIG_PACKAGES:
        raise SuiteError(f'{where}: config {config}: unknown package {package!r}; a config is a path relative to the '
                         f'repository root or PACKAGE::PATH with PACKAGE one of {", ".join(CONFIG_PACKAGES)}')
    distribution = MODULE2PACKAGE[package]  # what pip installs: mmsegmentation for mmseg
    if not is_installed(distribution):
        raise SuiteError(f'{where}: config {config} needs {distribution}, which is not installed '
                         f'(pip install {distribution})')
    path = osp.join(get_installed_path(distribution), '.mim', 'configs', relative)
    if not osp.isfile(path):
        raise SuiteError(f'{where}: config {config} does not exist: no {path} in the installed {distribution}')
    return path


def check_seeds(seeds, where):
    """The seeds as a list; raises SuiteError for a seed that is not an integer (True is not a seed) or that
    repeats (each seed is one run in one work dir)."""
    if not isinstance(seeds, (list, tuple)) or not all(
            isinstance(seed, int) and not isinstance(seed, bool) for seed in seeds):
        raise SuiteError(f'{where} must be a list of integers, got {seeds!r}')
    repeated = sorted({seed for seed in seeds if seeds.count(seed) > 1})
    if repeated:
        raise SuiteError(f'{where} repeats {repeated}: each seed is one run of each cell; list every seed once')
    return list(seeds)


def check_lrs(lrs, where):
    """The rates as a list; raises SuiteError for a rate that is not a finite positive number, or for two rates
    that name the same work dir (lr{LR:g}: rates that close are one cell)."""
    if not (isinstance(lrs, (list, tuple)) and lrs and all(
            isinstance(lr, (int, float)) and not isinstance(lr, bool) and math.isfinite(lr) and lr > 0
            for lr in lrs)):
        raise SuiteError(f'{where} must be None, a list of finite positive rates or dict(best_of=NAME), '
                         f'got {lrs!r}')
    names = [lr_name(lr) for lr in lrs]
    colliding = sorted({name for name in names if names.count(name) > 1})
    if colliding:
        raise SuiteError(f'{where} has rates that are one cell ({", ".join(colliding)}: '
                         f'{[lr for lr in lrs if lr_name(lr) in colliding]}); list each rate once')
    return list(lrs)


def load_variant(name, variant, suite_lrs, suite_reference, names, root, where):
    if not isinstance(variant, dict) or 'config' not in variant:
        raise SuiteError(f'{where} needs a config: dict(config=PATH, ...)')
    unknown = set(variant) - VARIANT_KEYS
    if unknown:
        raise SuiteError(f'{where}: unknown key(s) {", ".join(sorted(unknown))}; a variant has '
                         f'{", ".join(sorted(VARIANT_KEYS))}')
    config = variant['config']
    config_path = resolve_config(config, root, where)
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
    else:
        check_lrs(lrs, where)
    reference = variant['reference'] if 'reference' in variant else suite_reference
    if reference is not None and reference not in names:
        raise SuiteError(f'{where}: reference {reference!r} is not one of the variants ({", ".join(names)}); give '
                         'its baseline twin, or None for a variant compared with nothing')
    return Variant(name=name, config=config, config_path=config_path, lrs=list(lrs),
                   best_of=best_of, description=variant.get('description', ''),
                   reference=None if reference == name else reference,
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
    seeds = check_seeds(raw['seeds'], f'{path}: seeds')
    if not seeds:
        raise SuiteError(f'{path}: seeds must be a non-empty list of integers, got {raw["seeds"]!r}')
    selection_seeds = check_seeds(raw.get('selection_seeds') or [], f'{path}: selection_seeds')
    if set(selection_seeds) & set(seeds):
        raise SuiteError(f'{path}: seeds {sorted(set(selection_seeds) & set(seeds))} are in both selection_seeds and '
                         'seeds; a rate reported on the seeds that chose it is biased upwards (winner\'s curse)')
    if not isinstance(raw['variants'], dict) or not raw['variants']:
        raise SuiteError(f'{path}: variants must be a non-empty dict of NAME=dict(config=..., ...)')
    suite_lrs = check_lrs(raw['lrs'], f'{path}: lrs') if raw.get('lrs') else []
    if raw['reference'] not in raw['variants']:
        raise SuiteError(f'{path}: reference {raw["reference"]!r} is not one of the variants '
                         f'({", ".join(raw["variants"])})')
    variants = {name: load_variant(name, variant, suite_lrs, raw['reference'], raw['variants'], root,
                                   f'{path}: variant {name!r}')
                for name, variant in raw['variants'].items()}
    family = list(raw.get('family') or [])
    for name in family:
        if name not in variants or variants[name].reference is None:
            raise SuiteError(f'{path}: family names {name!r}, which is not a variant compared with a reference; the '
                             'family lists variants whose comparison with their reference Holm corrects over')
    early_loss = raw.get('early_loss')
    if early_loss is not None and not (isinstance(early_loss, int) and not isinstance(early_loss, bool)
                                       and early_loss >= 1):
        raise SuiteError(f'{path}: early_loss is the number of first iterations whose mean training loss is '
                         f'reported (an integer >= 1), got {early_loss!r}')
    held_out = options_list(raw.get('held_out', {}), f'{path}: held_out')
    if held_out and not selection_seeds:
        raise SuiteError(f'{path}: held_out tests the reported seeds on a split nothing is chosen on; it needs '
                         'selection_seeds, on whose validation the rates are chosen')
    extend_top = raw.get('extend_top', False)
    if not isinstance(extend_top, bool) or extend_top and not selection_seeds:
        raise SuiteError(f'{path}: extend_top must be True or False, and True needs selection_seeds (the extra rate '
                         f'runs there); got {extend_top!r}')
    suite = Suite(path=path, name=osp.splitext(osp.basename(path))[0], root=root, reference=raw['reference'],
                  seeds=seeds, lrs=suite_lrs, lr_key=raw.get('lr_key', 'optim_wrapper.optimizer.lr'),
                  metric=raw.get('metric', 'coco/bbox_mAP'), description=raw.get('description', ''),
                  options=options_list(raw.get('cfg_options', {}), f'{path}: cfg_options'), variants=variants,
                  selection_seeds=selection_seeds, family=family, escape=escape_rule(raw.get('escape'), path),
                  early_loss=early_loss, held_out=held_out, extend_top=extend_top)
    phase_of(suite)  # a best_of cycle fails here
    return suite


def escape_rule(raw, path):
    if raw is None:
        return EscapeRule()
    if not isinstance(raw, dict) or set(raw) - ESCAPE_KEYS:
        raise SuiteError(f'{path}: escape must be a dict with keys from {", ".join(sorted(ESCAPE_KEYS))}, got {raw!r}')
    rule = EscapeRule(**raw)
    if not 0 < rule.margin < 1 or not isinstance(rule.window, int) or rule.window < 1 or not (
            rule.after is None or isinstance(rule.after, int) and rule.after >= 0):
        raise SuiteError(f'{path}: escape needs 0 < margin < 1, an integer window >= 1 and after None or an '
                         f'iteration >= 0; got {raw!r}')
    return rule


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
