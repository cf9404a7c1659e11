"""The conditioner's share of a timm backbone's training step (torch and timm only).

The command of :mod:`condtok_mm.benchmark.backbone_share`, whose docstring gives its arguments and what it writes.
"""
from condtok_mm.benchmark.backbone_share import main

if __name__ == '__main__':
    main()
