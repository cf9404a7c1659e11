"""The optional dependencies a config asks for, checked before anything is built, naming the extra to install."""
import importlib.util

from mmengine.config import Config


class MissingExtraError(ImportError):
    """A config uses an optional dependency that is not installed; the message names the extra to install."""


def check_vis_backends(cfg: Config) -> None:
    """Raise MissingExtraError if the config's visualizer logs to TensorBoard and tensorboard is not installed.

    tensorboard is the extra ``condtok_mm[tensorboard]``: only configs with a ``TensorboardVisBackend`` need it.
    mmengine imports it when that backend first writes, after the model and data are built, and its message names
    neither condtok_mm nor the extra; checked here, the tools stop before building anything.
    """
    backends = (cfg.get('visualizer') or {}).get('vis_backends') or []
    names = [b['type'] if isinstance(b['type'], str) else b['type'].__name__ for b in backends]
    if any(name.split('.')[-1] == 'TensorboardVisBackend' for name in names) and \
            importlib.util.find_spec('tensorboard') is None:
        raise MissingExtraError('the config logs to TensorBoard (TensorboardVisBackend) and tensorboard is not '
                                'installed: pip install condtok_mm[tensorboard]')
