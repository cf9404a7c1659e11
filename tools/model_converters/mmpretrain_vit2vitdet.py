"""Convert an mmpretrain ViT classifier's checkpoint into our ViTDet backbones'.

The command of :mod:`condtok_mm.model_converters.mmpretrain_vit2vitdet`, whose docstring gives its arguments and
what it writes.
"""
from condtok_mm.model_converters.mmpretrain_vit2vitdet import main

if __name__ == '__main__':
    main()
