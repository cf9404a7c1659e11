"""Seaborn imported on first use, for the tools' start-up (mmdet 3.3 imports it in every process, for drawing).

mmdet 3.3 imports seaborn in every process that imports ``mmdet.utils`` (mmdet/utils/mot_error_visualize.py
L5-8) or ``mmdet.visualization`` (mmdet/visualization/local_visualizer.py L8-11), and seaborn imports pandas and
scipy.stats: about 1.3 s of the ~6.5 s a training or test process spends importing on one CPU core, paid by every
cell of a suite and every process of ``torchrun``, for a module that only mmdet's tracking visualisers and its
``analyze_logs.py`` call. :func:`load_seaborn_on_first_use` puts a stand-in module under the name seaborn that
imports the real one at the first attribute it is asked for, so those callers still get seaborn's functions.
(The standard library's ``importlib.util.LazyLoader`` does not do here: ``import seaborn`` itself reads the
module's ``__spec__``, which makes a lazy module load.) ``tools/train.py`` and ``tools/test.py`` call it before
they import mmdet; a script of this folder imports it by name, Python putting the script's folder on ``sys.path``.
"""
import importlib
import importlib.util
import sys
import types


class SeabornOnFirstUse(types.ModuleType):
    """The stand-in: the first attribute it lacks (any of seaborn's) imports seaborn, which then replaces it in
    ``sys.modules``; the stand-in takes seaborn's attributes, so a module that holds it keeps working."""

    def __getattr__(self, name):
        if sys.modules.get('seaborn') is self:
            del sys.modules['seaborn']
        seaborn = importlib.import_module('seaborn')
        self.__dict__.update(seaborn.__dict__)
        return getattr(seaborn, name)


def load_seaborn_on_first_use():
    """Register the stand-in as seaborn. Changes nothing where seaborn is already imported or is not installed
    (mmdet then sets its ``sns`` to None, as it would have). A seaborn that is installed but fails to import
    fails at its first use instead of leaving mmdet's ``sns`` None."""
    if 'seaborn' in sys.modules:
        return
    spec = importlib.util.find_spec('seaborn')
    if spec is None:
        return
    stand_in = SeabornOnFirstUse('seaborn')
    # What code that walks sys.modules reads (mmengine's Registry calls inspect.getmodule, which asks every module
    # for __file__), and __path__, so that `import seaborn.palettes` imports that submodule once, under the
    # stand-in: were __path__ missing, reading it would import seaborn, which imports its submodules, and the
    # import system would then execute seaborn.palettes a second time.
    stand_in.__spec__, stand_in.__loader__, stand_in.__file__ = spec, spec.loader, spec.origin
    stand_in.__path__ = list(spec.submodule_search_locations)
    sys.modules['seaborn'] = stand_in
