from .cond_neck import CondTokNeck
from .rescale_fpn import RescaleFPN

__all__ = ['CondTokNeck', 'RescaleFPN']
