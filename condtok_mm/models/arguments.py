"""Build-time checks of the arguments that say whether and where a model is conditioned.

CondSwinTransformer, CondViT, CondTokBackbone and CondTokNeck take a ``conditioning`` config and a choice of
where it acts (``condition_stages``, ``targets``, ``levels``). Each check raises a ValueError that names the
model, the argument and the fix, instead of the TypeError the first use of a wrong value would give, and a
conditioning config with nowhere to act is refused: it would build an unconditioned model that its config
calls conditioned.
"""
from collections.abc import Iterable, Mapping
from typing import Any, Optional, Sequence, Tuple

__all__ = ['check_conditioning', 'check_indices', 'check_names', 'check_conditioned_somewhere']


def check_conditioning(conditioning: Any, where: str) -> Optional[Mapping]:
    """``conditioning`` when it is a config dict or None; else a ValueError naming the fix."""
    if conditioning is None or isinstance(conditioning, Mapping):
        return conditioning
    raise ValueError(f'{where}: conditioning={conditioning!r} is invalid; use a conditioner config such as '
                     "dict(type='TokenConditioner'), or None for the unconditioned model")


def check_indices(value: Any, name: str, count: Optional[int], where: str, what: str,
                  example: str) -> Tuple[int, ...]:
    """``value`` as a tuple of distinct ints, each in range(count) (any int when count is None).

    Args:
        value: what the config gave.
        name (str): the argument's name, for the message.
        count (int, optional): how many there are to index (e.g. the backbone's stages).
        where (str): the model, for the message.
        what (str): what the indices are, e.g. 'stage indices', for the message.
        example (str): a valid value (and what it means), for the message.
    """
    valid = f' from {list(range(count))}' if count is not None else ''
    fix = f'use distinct {what}{valid} in a sequence such as {example}'
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise ValueError(f'{where}: {name}={value!r} is invalid; {fix}')
    indices = tuple(value)
    invalid = [i for i in indices if isinstance(i, bool) or not isinstance(i, int)
               or (count is not None and not 0 <= i < count)]
    if invalid or len(set(indices)) != len(indices):
        raise ValueError(f'{where}: {name}={value!r} is invalid; {fix}')
    return indices


def check_names(value: Any, name: str, where: str, example: str) -> Tuple[str, ...]:
    """``value`` as a tuple of distinct str (a sequence of names, not one name)."""
    names = tuple(value) if isinstance(value, Iterable) and not isinstance(value, str) else None
    if names is None or not all(isinstance(item, str) for item in names) or len(set(names)) != len(names):
        raise ValueError(f'{where}: {name}={value!r} is invalid; use distinct submodule names in a sequence '
                         f'such as {example}')
    return names


def check_conditioned_somewhere(conditioning: Optional[Mapping], chosen: Sequence, name: str, where: str,
                                example: str) -> None:
    """Refuse a conditioning config with nowhere to act (``chosen`` empty), which would silently build the
    unconditioned model."""
    if conditioning is not None and len(chosen) == 0:
        raise ValueError(f'{where}: {name}={tuple(chosen)!r} conditions nothing, but conditioning is set '
                         f'({dict(conditioning)!r}); say where to condition, e.g. {name}={example}, or set '
                         'conditioning=None for the unconditioned model')
