import pytest
import torch
from mmengine.config import Config
from mmengine.registry import init_default_scope
from mmengine.runner import Runner

import condtok_mm  # noqa: F401
from condtok_mm.registry import MODELS
from helpers.cfg_options import cfg_options_dict, data_options
from helpers.repo import DEMO, REPO_ROOT

XCIT_CONDTOK = f'{REPO_ROOT}/configs/xcit/mask-rcnn_xcit-s12-p16-condtok_rescale-fpn_ms-crop-3x_coco.py'


def test_same_stride_levels_become_a_pyramid():
    init_default_scope('mmdet')
    neck = MODELS.build(dict(type='RescaleFPN', in_channels=16, fpn=dict(type='FPN', out_channels=8,
                                                                         num_outs=5)))
    outs = neck([torch.randn(2, 16, 5, 7) for _ in range(4)])  # stride 16 of an 80x112 image
    assert [tuple(o.shape[-2:]) for o in outs] == [(20, 28), (10, 14), (5, 7), (2, 3), (1, 2)]
    with pytest.raises(ValueError, match='got 3 feature maps for 4 scales'):
        neck([torch.randn(1, 16, 4, 4)] * 3)
    with pytest.raises(ValueError, match=r'scales \[3\] are not supported'):
        MODELS.build(dict(type='RescaleFPN', in_channels=16, scales=(3, 1), fpn=dict(type='FPN',
                                                                                   out_channels=8,
                                                                                   num_outs=2)))


@pytest.mark.slow
def test_xcit_condtok_mask_rcnn_trains_a_step_on_shapes(shapes_root, tmp_path):
    # the conditioned XCiT-S12 detector of configs/xcit, shrunk, on the demo's data and schedule
    xcit = Config.fromfile(XCIT_CONDTOK).model
    xcit.backbone.backbone.update(embed_dims=32, depth=4, num_heads=4, out_indices=(0, 1, 2, 3),
                                  init_cfg=None)
    xcit.neck.update(in_channels=32, fpn=dict(type='FPN', out_channels=64, num_outs=5))
    cfg = Config.fromfile(DEMO)
    cfg.model.backbone = xcit.backbone
    cfg.model.neck = xcit.neck
    cfg.merge_from_dict(cfg_options_dict(data_options(shapes_root, 1)))
    cfg.train_dataloader.dataset.indices = 4
    cfg.val_cfg = cfg.val_dataloader = cfg.val_evaluator = None
    cfg.custom_hooks = []
    cfg.work_dir = str(tmp_path)
    runner = Runner.from_cfg(cfg)
    assert type(runner.model.backbone).__name__ == 'CondTokBackbone'
    before = runner.model.backbone.wrapped.patch_embed.state_dict()
    before = {k: v.clone() for k, v in before.items()}
    runner.train()
    assert runner.iter == 1
    after = runner.model.backbone.wrapped.patch_embed.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
