"""Import condtok_mm's pure-torch modules where only torch is installed, as on a lent GPU machine that has no
OpenMMLab stack: ``condtok_mm/__init__.py`` registers the OpenMMLab modules first, so where mmengine cannot be
imported the package is stood in for by a bare package object whose path is this checkout's ``condtok_mm/``, and
``import condtok_mm.conditioning`` then runs ``conditioning/`` alone (it imports nothing outside itself).

    from bare_torch import import_conditioning      # in a benchmark script
    python -m pytest -p bare_torch --noconftest ...  # pytest, tools/benchmark on PYTHONPATH (tests/ is put on
                                                     # sys.path here, as tests/conftest.py's folder would be)

Where mmengine imports, nothing is stood in for: the installed package is used as it is.
"""
import importlib
import os.path as osp
import sys
import types

REPO_ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))


def _mmengine_importable() -> bool:
    try:
        importlib.import_module('mmengine')
    except ImportError:
        return False
    return True


def install() -> bool:
    """Stand in for ``condtok_mm`` where mmengine is missing; return whether it did."""
    if 'condtok_mm' in sys.modules or _mmengine_importable():
        return False
    package = types.ModuleType('condtok_mm', 'condtok_mm without its registration (only torch is installed here)')
    package.__path__ = [osp.join(REPO_ROOT, 'condtok_mm')]
    sys.modules['condtok_mm'] = package
    return True


def import_conditioning():
    """``condtok_mm.conditioning``, with the OpenMMLab stack or without it."""
    install()
    return importlib.import_module('condtok_mm.conditioning')


def pytest_configure(config):
    """As a pytest plugin (-p bare_torch): stand in before any test module is collected, and let the tests import
    their helpers (tests/helpers) as they do under tests/conftest.py, which --noconftest leaves out."""
    install()
    if osp.join(REPO_ROOT, 'tests') not in sys.path:
        sys.path.insert(0, osp.join(REPO_ROOT, 'tests'))
