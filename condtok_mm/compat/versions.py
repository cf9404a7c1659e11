"""Which installed versions have the bugs that :mod:`condtok_mm.compat` fixes."""
import mmengine
import torch
from mmengine.utils import digit_version

# The newest mmengine that has every bug fixed here (0.10.7, March 2025, was the newest release when this was
# written; `pip index versions mmengine`). A newer mmengine may have fixed any of them, so none is applied to
# it: re-check each against the new version before raising this bound.
LAST_MMENGINE_WITH_THE_BUGS = '0.10.7'


def mmengine_has_the_bugs() -> bool:
    """Whether the installed mmengine is one whose bugs these fixes cover (mmengine <= 0.10.7)."""
    return digit_version(mmengine.__version__) <= digit_version(LAST_MMENGINE_WITH_THE_BUGS)


def torch_loads_weights_only() -> bool:
    """Whether torch.load defaults to ``weights_only=True`` (torch >= 2.6), which mmengine <= 0.10.7 does not
    expect."""
    return digit_version(torch.__version__) >= digit_version('2.6.0')
