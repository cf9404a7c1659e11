"""Facts about the conditioner on real patch tokens that docs/en/user_guides/conditioning.md states, measured on the demo's mini-Swin patch embedding at initialisation:

- how much an image's correction changes when a wider batch-mate pads it, if the padding is conditioned with it
  (what ValidRegionDetDataPreprocessor prevents);
- solver='reference_gram' vs solver='reference_svd' on rank-deficient tokens: the same kappa, another X + C.

    .venv/bin/python docs/en/user_guides/conditioning_facts.py
"""
import os.path as osp

import torch
import torch.nn.functional as F
from mmengine.config import Config
from mmengine.registry import init_default_scope

import condtok_mm  # noqa: F401  (registration)
from condtok_mm.conditioning import condition_number, condition_tokens
from condtok_mm.registry import MODELS

REPO_ROOT = osp.dirname(osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))


def relative(a, b):
    return 100 * float((a - b).norm() / b.norm())


init_default_scope('mmdet')
torch.manual_seed(0)
cfg = Config.fromfile(osp.join(REPO_ROOT, 'configs', 'demo', 'mask-rcnn_swin-mini-condtok_fpn_12e_shapes.py'))
patch_embed = MODELS.build(cfg.model.backbone).patch_embed
image = torch.randn(1, 3, 128, 128)  # a normalized 128 x 128 image
with torch.no_grad():
    tokens, hw_shape = patch_embed(image)
    padded, padded_hw = patch_embed(F.pad(image, (0, 64)))  # batched beside a 128 x 192 image: zeros on the right

singular_values = torch.linalg.svdvals(tokens[0].double())
print(f'mini-Swin patch tokens at initialisation, 128 x 128: {tuple(tokens.shape[1:])}, '
      f'{int((singular_values > 1e-5 * singular_values[0]).sum())} singular values above 1e-5 s_1')

alone = condition_tokens(tokens.view(1, *hw_shape, -1))
with_padding = condition_tokens(padded.view(1, *padded_hw, -1))[:, :, :hw_shape[1]]
print(f'conditioned with the padding of a 128 x 192 batch-mate vs alone, on its own tokens: '
      f'{relative(with_padding, alone):.1f} % (||.||_F, relative)')

gram = condition_tokens(tokens, solver='reference_gram')
svd = condition_tokens(tokens, solver='reference_svd')
print(f'kappa(X + C): gram {float(condition_number(gram)):.6f}, svd {float(condition_number(svd)):.6f}; '
      f'X + C of gram vs svd: {relative(gram, svd):.1f} % (||.||_F, relative)')
