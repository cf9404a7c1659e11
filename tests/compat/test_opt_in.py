"""condtok_mm.compat is opt-in: importing condtok_mm changes nothing outside its registries, opting in changes
exactly what the fixes list (each in a fresh process), and apply() applies the table of fixes."""
import json
import subprocess
import sys
import textwrap

import pytest

from condtok_mm import compat
from helpers.repo import REPO_ROOT

# Records every attribute of every loaded module of the stack (and of each class defined there), then runs
# STEP, then prints, as JSON, every recorded attribute that is now another object or gone. Modules that
# condtok_mm imports are loaded before the record, so that only what the step changes in them shows.
SIDE_EFFECTS_SCRIPT = """
import json, sys
sys.path.insert(0, {repo!r})
import mmengine.runner, mmengine.dist, mmengine.hooks, mmdet.models, mmdet.datasets, mmdet.evaluation
import mmdet.engine, mmpretrain.models, torch.serialization
from mmengine.runner.checkpoint import CheckpointLoader
{before}

STACK = ('torch', 'mmengine', 'mmdet', 'mmcv', 'mmpretrain', 'numpy', 'pycocotools', 'faster_coco_eval')

def record():
    state = {{}}
    for name, module in list(sys.modules.items()):
        if module is None or not name.split('.')[0] in STACK:
            continue
        for attr, value in list(vars(module).items()):
            state[f'{{name}}.{{attr}}'] = id(value)
            if isinstance(value, type) and value.__module__ == name:
                for class_attr, class_value in list(vars(value).items()):
                    state[f'{{name}}.{{attr}}.{{class_attr}}'] = id(class_value)
    for prefix, loader in CheckpointLoader._schemes.items():
        state[f'CheckpointLoader._schemes[{{prefix!r}}]'] = id(loader)
    for safe_global in torch.serialization.get_safe_globals():
        state[f'torch.serialization safe global {{safe_global!r}}'] = id(safe_global)
    return state

before = record()
{step}
after = record()
print(json.dumps(sorted(key for key, value in before.items() if after.get(key) != value)))
"""


def side_effects(step, before=''):
    """The names of the stack's functions, classes' attributes, checkpoint schemes and torch safe globals that
    are other objects after ``step`` (Python source) has run in a fresh process."""
    result = subprocess.run([sys.executable, '-c', SIDE_EFFECTS_SCRIPT.format(repo=REPO_ROOT, before=before,
                                                                            step=textwrap.dedent(step))],
                            capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.splitlines()[-1])


PATCHED_BY_THE_FIXES = [
    "CheckpointLoader._schemes['']", "CheckpointLoader._schemes['(\\\\S+\\\\:)?petrel://']",
    "CheckpointLoader._schemes['(\\\\S+\\\\:)?s3://']", "CheckpointLoader._schemes['http://']",
    "CheckpointLoader._schemes['https://']", "CheckpointLoader._schemes['open-mmlab://']",
    "CheckpointLoader._schemes['openmmlab://']", "CheckpointLoader._schemes['pavi://']",
    'mmengine._strategy.colossalai.save_checkpoint', 'mmengine._strategy.deepspeed.save_checkpoint',
    'mmengine.config.config.FormatCode', 'mmengine.dist.utils._init_dist_pytorch',
    'mmengine.dist.utils._init_dist_slurm',
    'mmengine.hooks.checkpoint_hook.CheckpointHook._save_checkpoint_with_step',
    'mmengine.runner.checkpoint.CheckpointLoader._schemes',  # register_scheme sorts the schemes into a new dict
    'mmengine.runner.checkpoint.load_from_http',  # called by name by the torchvision:// and mmcls:// loaders
    'mmengine.runner.checkpoint.save_checkpoint', 'mmengine.runner.loops.ValLoop.run',
    'mmengine.runner.runner.Runner.resume', 'mmengine.runner.runner.Runner.save_checkpoint',
    'mmengine.runner.runner.Runner.scale_lr', 'mmengine.runner.runner.Runner.wrap_model',
    'mmengine.runner.runner.save_checkpoint', 'mmengine.runner.save_checkpoint']


@pytest.mark.slow  # a fresh Python process (~10 s of imports on 2 cores)
def test_opting_in_changes_what_the_fixes_list():
    # the check below sees a change where there is one
    assert side_effects('import condtok_mm.compat.enable') == PATCHED_BY_THE_FIXES


@pytest.mark.slow  # a fresh Python process (~10 s of imports on 2 cores)
@pytest.mark.parametrize('step', [
    'import condtok_mm',
    """
    from mmengine.config import Config
    Config.fromfile({host_config!r})  # imports custom_imports
    """])
def test_importing_condtok_mm_changes_nothing_outside_its_registries(step, tmp_path):
    host_config = tmp_path / 'host_config.py'  # a host project's config that uses our backbone
    host_config.write_text("custom_imports = dict(imports=['condtok_mm'], allow_failed_imports=False)\n"
                           "model = dict(backbone=dict(type='CondSwinTransformer'))\n")
    assert side_effects(step.format(host_config=str(host_config))) == []


@pytest.mark.slow  # a fresh Python process (~10 s of imports on 2 cores)
def test_no_fix_applies_to_an_mmengine_newer_than_the_last_one_with_the_bugs():
    # a newer mmengine may have fixed any of these bugs (none is released yet), so each fix stands aside
    assert side_effects("""
        from condtok_mm import compat
        assert compat.apply() == (), compat.apply()
        """, before="mmengine.__version__ = '0.10.8'") == []


def test_apply_applies_every_fix_of_the_table_in_its_order():
    assert [fix.name for fix in compat.FIXES] == ['checkpoint_loading', 'cpu_launchers', 'auto_scale_lr',
                                                  'atomic_checkpoints', 'exact_resume', 'config_formatting']
    assert compat.apply() == tuple(fix.name for fix in compat.FIXES)  # this mmengine has every bug
