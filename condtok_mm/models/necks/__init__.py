from .cond_neck import CondTokNeck
from .rescale_fpn import RescaleFPN
from .vitdet_fpn import ViTDetFPN, ViTDetLN2d

__all__ = ['CondTokNeck', 'RescaleFPN', 'ViTDetFPN', 'ViTDetLN2d']
