"""tools/lazy_seaborn.py: the tools start without importing seaborn (nor pandas and scipy.stats, which it imports),
and mmdet's callers of seaborn still get the real module."""
import importlib.util
import os.path as osp
import re
import subprocess
import sys

import pytest

from conftest import REPO_ROOT

TOOLS = osp.join(REPO_ROOT, 'tools')
sys.path.insert(0, TOOLS)
from lazy_seaborn import load_seaborn_on_first_use  # noqa: E402

SEABORNS_IMPORTS = ('seaborn.palettes', 'pandas', 'scipy.stats')


def imported_modules(importtime_output):
    """The modules that ``python -X importtime`` reports as imported."""
    return set(re.findall(r'^import time:\s+\d+ \|\s+\d+ \|\s+(\S+)$', importtime_output, re.M))


@pytest.mark.slow
@pytest.mark.parametrize('tool', ['train.py', 'test.py'])
def test_the_tools_import_mmdet_without_seaborn(tool):
    result = subprocess.run([sys.executable, '-X', 'importtime', osp.join(TOOLS, tool), '--help'],
                            capture_output=True, text=True, cwd=REPO_ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    modules = imported_modules(result.stderr)
    assert {'mmdet.utils.mot_error_visualize', 'condtok_mm'} <= modules
    assert not modules & set(SEABORNS_IMPORTS)


@pytest.mark.slow
def test_mmdets_seaborn_is_the_real_one_on_first_use():
    program = (f'import sys; sys.path.insert(0, {TOOLS!r}); from lazy_seaborn import load_seaborn_on_first_use; '
               'load_seaborn_on_first_use(); import mmdet.utils.mot_error_visualize as mot, mmdet.visualization; '
               f'print(sorted(m for m in {SEABORNS_IMPORTS!r} if m in sys.modules)); '
               'print(mot.sns.color_palette()); import seaborn; print(seaborn.color_palette()); '
               f'print(sorted(m for m in {SEABORNS_IMPORTS!r} if m in sys.modules))')
    result = subprocess.run([sys.executable, '-c', program], capture_output=True, text=True, cwd=REPO_ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    before, palette, seaborns_palette, after = result.stdout.splitlines()
    assert before == '[]'
    assert palette == seaborns_palette and palette.count('(') == 10  # seaborn's default palette: 10 colours
    assert after == str(sorted(SEABORNS_IMPORTS))


@pytest.mark.slow
def test_a_submodule_imported_before_seaborn_is_seaborns_own():
    program = (f'import sys; sys.path.insert(0, {TOOLS!r}); from lazy_seaborn import load_seaborn_on_first_use; '
               'load_seaborn_on_first_use(); import seaborn.palettes; palettes = sys.modules["seaborn.palettes"]; '
               'print(seaborn.color_palette is palettes.color_palette is sys.modules["seaborn"].color_palette)')
    result = subprocess.run([sys.executable, '-c', program], capture_output=True, text=True, cwd=REPO_ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == 'True'  # seaborn.palettes executed once


def test_an_imported_seaborn_is_kept():
    import seaborn
    load_seaborn_on_first_use()
    assert sys.modules['seaborn'] is seaborn


def test_without_seaborn_nothing_is_registered(monkeypatch):
    monkeypatch.delitem(sys.modules, 'seaborn', raising=False)
    monkeypatch.setattr(importlib.util, 'find_spec', lambda name, *args: None)
    load_seaborn_on_first_use()
    assert 'seaborn' not in sys.modules
