"""The committed study designs (configs/suites/*.py) and records (docs/en/studies/records/) read with the hooks as
registered now: a suite's ``custom_hooks.0.interval`` sets AttentionKappaHook's interval, and every record, of any
format, names registered hooks, its AttentionKappaHook the one its config resolves to now."""
import glob
import inspect
import os.path as osp
from types import SimpleNamespace

import pytest
from mmdet.registry import HOOKS

import condtok_mm  # noqa: F401  (registration)
from condtok_mm.suites.fingerprint import FINGERPRINT_FILE, FORMAT_KEY, cell_record
from condtok_mm.suites.plan import resolved_config
from condtok_mm.suites.schema import load_suite, resolve_config
from helpers.repo import REPO_ROOT

SUITES = sorted(glob.glob(osp.join(REPO_ROOT, 'configs', 'suites', '*.py')))
RECORDS = sorted(glob.glob(osp.join(REPO_ROOT, 'docs', 'en', 'studies', 'records', '**', FINGERPRINT_FILE),
                           recursive=True))
INTERVAL = 'custom_hooks.0.interval='


def kappa_hooks(hooks):
    return [dict(hook) for hook in hooks if hook['type'] == 'AttentionKappaHook']


def registered(hooks):
    """Whether every hook type names a hook class (a renamed one resolves to the function that refuses it)."""
    return all(inspect.isclass(HOOKS.get(hook['type'])) for hook in hooks)


@pytest.mark.parametrize('path', SUITES, ids=osp.basename)
def test_a_suites_cells_build_registered_hooks_and_its_interval_option_sets_the_kappa_hooks(path):
    suite = load_suite(path, REPO_ROOT)
    for variant in suite.variants.values():
        options = [*suite.options, *variant.options]
        cfg = resolved_config(variant.config_path, options)
        hooks = cfg.get('custom_hooks', [])
        assert registered(hooks), (variant.name, hooks)
        intervals = [int(option[len(INTERVAL):]) for option in options if option.startswith(INTERVAL)]
        if intervals:
            assert dict(hooks[0]) == dict(type='AttentionKappaHook', interval=intervals[-1]), variant.name


def test_every_committed_record_reads_with_registered_hooks_and_the_kappa_hook_its_config_has_now():
    assert len(RECORDS) > 100
    current = {}  # (config file, hook options): the AttentionKappaHook entries the config resolves to now
    formats = set()
    for path in RECORDS:
        record = cell_record(SimpleNamespace(work_dir=osp.dirname(path)))
        formats.add(record[FORMAT_KEY])
        hooks = record['config'].get('custom_hooks', [])
        assert registered(hooks), (path, hooks)
        key = (record['config_file'], tuple(option for option in record['options']
                                            if option.startswith('custom_hooks')))
        if key not in current:
            config = resolve_config(key[0], REPO_ROOT)
            current[key] = kappa_hooks(resolved_config(config, list(key[1])).get('custom_hooks', []))
        assert kappa_hooks(hooks) == current[key], path
    assert 1 in formats  # records that say no format, which must go on reading
