"""Hook names condtok_mm does not register any more, each refused with the name to write instead.

A config that names one fails when its hook is built, with a KeyError (mmengine's error for a type it does not
know) that names the registered type to use; mmengine's own error would only say that the name is unknown. Suite
records that name one still read as the same cells (:func:`condtok_mm.suites.fingerprint.recorded_fingerprint`).
"""
from typing import Callable, Dict

from condtok_mm.registry import HOOKS

# {name no longer registered: the registered type that does its work}. AttentionKappaHook measures kappa and
# applies nothing, so its name does not say "conditioning", which is what the TokenConditioner does.
RENAMED_HOOKS: Dict[str, str] = {'AttentionConditioningHook': 'AttentionKappaHook'}


def refusal(old: str, new: str) -> Callable:
    """What the registry builds for ``old``: a function that raises a KeyError naming ``new``.

    Args:
        old (str): the name no longer registered.
        new (str): the registered type to write instead.
    """
    def refuse(*args, **kwargs):
        raise KeyError(f"type='{old}' is not a condtok_mm hook: write type='{new}' in custom_hooks (same "
                       'arguments; it records kappa of the tokens and the attention, and applies no conditioning)')

    refuse.__name__ = refuse.__qualname__ = old
    return refuse


for _old, _new in RENAMED_HOOKS.items():
    HOOKS.register_module(name=_old, module=refusal(_old, _new))
