"""A hook name condtok_mm does not register any more is refused where a config builds it, with the registered type
to write instead (condtok_mm/engine/hooks/renamed.py)."""
import inspect

import pytest
from mmdet.registry import HOOKS as MMDET_HOOKS
from mmengine.config import Config
from mmengine.runner import Runner

import condtok_mm  # noqa: F401  (registration)
from condtok_mm.engine.hooks import RENAMED_HOOKS
from condtok_mm.registry import HOOKS
from helpers.repo import DEMO

REFUSAL = (r"type='AttentionConditioningHook' is not a condtok_mm hook: write type='AttentionKappaHook' in "
           r'custom_hooks \(same arguments; it records kappa')


def test_each_renamed_hook_maps_to_a_registered_hook_class():
    assert RENAMED_HOOKS == {'AttentionConditioningHook': 'AttentionKappaHook'}
    for new in RENAMED_HOOKS.values():
        assert inspect.isclass(HOOKS.get(new)) and HOOKS.get(new).__name__ == new


@pytest.mark.parametrize('registry', [HOOKS, MMDET_HOOKS], ids=['root', 'mmdet'])
def test_a_renamed_hook_is_refused_naming_the_type_to_write(registry):
    with pytest.raises(KeyError, match=REFUSAL):
        registry.build(dict(type='AttentionConditioningHook', interval=50))


def test_a_config_that_names_a_renamed_hook_stops_the_runner_naming_the_type_to_write(tmp_path):
    cfg = Config.fromfile(DEMO)
    cfg.custom_hooks = [dict(type='AttentionConditioningHook', interval=50)]
    cfg.work_dir = str(tmp_path)
    cfg.visualizer.name = str(tmp_path)  # visualizers are per-process singletons by name
    with pytest.raises(KeyError, match=REFUSAL):
        Runner.from_cfg(cfg)
