"""ViTDetLayerDecayOptimizerConstructor: layer-wise learning-rate decay for plain-ViT detectors."""
from typing import Dict, List, Tuple

import torch.nn as nn
from mmengine.logging import MMLogger
from mmengine.optim import DefaultOptimWrapperConstructor
from torch.nn.modules.batchnorm import _NormBase

from condtok_mm.models.necks.vitdet_fpn import ViTDetLN2d
from condtok_mm.registry import OPTIM_WRAPPER_CONSTRUCTORS

# Norm layers, found by type rather than by name (a name containing 'norm' is not always one).
NORM_LAYERS = (nn.LayerNorm, nn.GroupNorm, _NormBase, ViTDetLN2d)
# Backbone submodules and parameters that embed the input: layer 0.
EMBEDDING_NAMES = ('patch_embed', 'pos_embed', 'cls_token', 'mask_token')


@OPTIM_WRAPPER_CONSTRUCTORS.register_module()
class ViTDetLayerDecayOptimizerConstructor(DefaultOptimWrapperConstructor):
    """Layer-wise learning-rate decay for a detector with a plain ViT backbone, as in ViTDet.

    Every parameter gets a layer id: 0 for the backbone's patch embedding and position embedding (and class or
    mask token); i + 1 for the backbone's ``blocks.i``; ``num_layers + 1`` for all else (neck, heads, the rest of
    the backbone). The token conditioners have no parameters, so they take no learning rate. Its learning rate is
    ``lr * decay_rate ** (num_layers + 1 - layer_id)``: the heads train at ``lr``, the last block at
    ``decay_rate * lr``, the patch embedding at ``decay_rate ** (num_layers + 1) * lr``. The ids are read
    from the names relative to ``model.backbone``: the first ``patch_embed``/``pos_embed``/... component or
    ``blocks.<i>`` pair decides, wherever it sits (a wrapped ViT's ``vit.blocks.3.attn.qkv.weight`` is block
    3), and any other name falls to ``num_layers + 1`` instead of breaking.

    Weight decay is ``weight_decay`` except for the parameters of norm layers (LayerNorm, ViTDetLN2d,
    GroupNorm, BatchNorm, found by type), biases and absolute position embeddings, which get none (the MAE
    fine-tuning rule; mmdet's projects/ViTDet exempts only the blocks' norms and the position embedding, and
    detectron2's ViTDet all norms and the position embedding). The relative position embeddings are
    decayed, as in both.

    ``paramwise_cfg`` keys:
        num_layers (int): blocks of the ViT, 12 for ViT-B.
        decay_rate (float): 0 < decay_rate <= 1, 0.7 for ViT-B.
        decay_type (str): 'layer_wise', the only kind (accepted so mmdet's ViTDet configs carry over).

    Args:
        optim_wrapper_cfg (dict): the optimizer wrapper config, with ``optimizer``.
        paramwise_cfg (dict): the keys above.
    """

    def __init__(self, optim_wrapper_cfg: dict, paramwise_cfg: dict = None):
        super().__init__(optim_wrapper_cfg, paramwise_cfg)
        cfg = self.paramwise_cfg
        unknown = set(cfg) - {'num_layers', 'decay_rate', 'decay_type'}
        if unknown:
            raise ValueError(f'ViTDetLayerDecayOptimizerConstructor: paramwise_cfg keys {sorted(unknown)} '
                             'are not supported; it takes num_layers, decay_rate and decay_type')
        num_layers = cfg.get('num_layers')
        if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1:
            raise ValueError(f'ViTDetLayerDecayOptimizerConstructor: paramwise_cfg.num_layers={num_layers!r}'
                             ' must be the number of ViT blocks (an integer >= 1, 12 for ViT-B)')
        decay_rate = cfg.get('decay_rate')
        if isinstance(decay_rate, bool) or not isinstance(decay_rate, (int, float)) \
                or not 0 < decay_rate <= 1:
            raise ValueError(f'ViTDetLayerDecayOptimizerConstructor: paramwise_cfg.decay_rate='
                             f'{decay_rate!r} must be a number in (0, 1] (0.7 for ViT-B)')
        if cfg.get('decay_type', 'layer_wise') != 'layer_wise':
            raise ValueError(f'ViTDetLayerDecayOptimizerConstructor: decay_type={cfg["decay_type"]!r} is '
                             "not supported; use 'layer_wise'")
        self.num_layers = num_layers
        self.decay_rate = float(decay_rate)

    def backbone_layer_id(self, name: str) -> int:
        """Layer id of a backbone parameter from its name relative to the backbone."""
        parts = name.split('.')
        for i, part in enumerate(parts):
            if part in EMBEDDING_NAMES:
                return 0
            if part == 'blocks' and i + 1 < len(parts) and parts[i + 1].isdigit():
                block = int(parts[i + 1])
                if block >= self.num_layers:
                    raise ValueError(f'ViTDetLayerDecayOptimizerConstructor: parameter {name!r} is in block '
                                     f'{block} but paramwise_cfg.num_layers={self.num_layers}; set it to '
                                     'the number of blocks of the backbone')
                return block + 1
        return self.num_layers + 1

    def add_params(self, params: List[dict], module: nn.Module, **kwargs) -> None:
        """Add one parameter group per (layer id, weight decay or not) to ``params``."""
        backbone = getattr(module, 'backbone', None)
        if backbone is None:
            raise ValueError('ViTDetLayerDecayOptimizerConstructor: the model has no `backbone`; layer-wise '
                             'decay needs a detector (or classifier) with a ViT backbone')
        layer_ids = {id(p): self.backbone_layer_id(name) for name, p in backbone.named_parameters()}
        groups: Dict[Tuple[int, bool], dict] = {}
        seen = set()  # a parameter shared by two modules goes into one group only
        for module_name, submodule in module.named_modules():
            for param_name, param in submodule.named_parameters(recurse=False):
                if not param.requires_grad or id(param) in seen:
                    continue
                seen.add(id(param))
                layer_id = layer_ids.get(id(param), self.num_layers + 1)
                no_decay = (isinstance(submodule, NORM_LAYERS) or param_name == 'bias'
                            or param_name.endswith('pos_embed'))
                group = groups.get((layer_id, no_decay))
                if group is None:
                    group = dict(params=[], param_names=[],
                                 lr=self.base_lr * self.decay_rate**(self.num_layers + 1 - layer_id))
                    # without a weight_decay in the optimizer config, the decayed groups keep the
                    # optimizer's default
                    if no_decay or self.base_wd is not None:
                        group['weight_decay'] = 0. if no_decay else self.base_wd
                    groups[(layer_id, no_decay)] = group
                group['params'].append(param)
                group['param_names'].append(f'{module_name}.{param_name}' if module_name else param_name)
        logger = MMLogger.get_current_instance()
        for (layer_id, no_decay), group in sorted(groups.items()):
            logger.info(f'layer-wise decay: layer {layer_id}, lr {group["lr"]:.4g}, '
                        f'{"no weight decay" if no_decay else "weight decay"}: '
                        f'{len(group["params"])} tensors ({group["param_names"][0]}, ...)')
        params.extend(groups[key] for key in sorted(groups))
