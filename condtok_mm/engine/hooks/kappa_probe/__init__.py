"""The kappa probe: forward hooks that record kappa of a backbone's tokens and attention
(:class:`KappaProbe`), one recorder per kind of quantity."""
from .attention_input import AttentionInputKappa
from .attention_layers import AttentionLayerKappa
from .probe import KappaProbe
from .records import KAPPA_CAP, SINGULAR_KAPPA, KappaRecords
from .tokens import TokenKappa

__all__ = ['KappaProbe', 'KappaRecords', 'KAPPA_CAP', 'SINGULAR_KAPPA', 'TokenKappa', 'AttentionInputKappa',
           'AttentionLayerKappa']
