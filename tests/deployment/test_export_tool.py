"""tools/deployment/export_onnx.py: the backbone route (a checkpoint's weights, the solver switched, onnxruntime
checked against PyTorch), and where the whole detector's export stops."""
import os.path as osp

import pytest
import torch
from condtok_mm.deployment import export_tool as tool
from helpers.repo import REPO_ROOT, run_main
from mmengine.config import Config
from mmengine.registry import init_default_scope

from condtok_mm.deployment import use_exportable_solver
from condtok_mm.deployment.parity import output_parity
from condtok_mm.registry import MODELS

DEMO_SWIN = osp.join(REPO_ROOT, 'configs', 'demo', 'mask-rcnn_swin-mini-condtok_fpn_12e_shapes.py')


@pytest.mark.slow
def test_the_tool_exports_the_swin_demo_backbone_and_onnxruntime_matches_pytorch(tmp_path):
    init_default_scope('mmdet')
    detector = MODELS.build(Config.fromfile(DEMO_SWIN).model)
    checkpoint = tmp_path / 'demo.pth'
    torch.save(dict(state_dict=detector.state_dict()), checkpoint)
    out_file = tmp_path / 'swin.onnx'
    result = run_main(tool.main, 'export_onnx.py', DEMO_SWIN, str(checkpoint), '--shape', '64', '96',
                      '--backbone-only', '--out-file', str(out_file), '--verify')
    assert result.returncode == 0, result.stdout + result.stderr
    assert "CondSwinTransformer stage 0: solver='auto' -> 'newton_schulz' for the export" in result.stdout
    assert 'feat3 (1, 256, 2, 3)' in result.stdout
    backbone = detector.backbone
    backbone.eval()  # mmdet's SwinTransformer.train() returns None: no chaining
    use_exportable_solver(backbone)
    # the graph computes the conditioned backbone (--verify checked its parity): the unconditioned twin's features
    # are far from it
    image = torch.randn(1, 3, 64, 96, generator=torch.Generator().manual_seed(2))
    backbone.conditioners['0'].alpha = 0.0
    assert all(output.onnxruntime_vs_pytorch > 1e-2 for output in output_parity(backbone, str(out_file),
                                                                                  {'image': image}))


@pytest.mark.slow
def test_the_whole_detector_stops_where_the_deployment_guide_says(tmp_path):
    # docs/en/user_guides/deployment.md#the-whole-detector: mmdet 3.3's box decoding imports mmdet 2.x's
    # mmdet.core.export under an ONNX export; when that changes, the guide's stopping point must too
    result = run_main(tool.main, 'export_onnx.py', DEMO_SWIN, '--shape', '64', '96', '--out-file',
                      str(tmp_path / 'detector.onnx'))
    assert result.returncode == 1
    assert ("torch.onnx.export of the whole MaskRCNN stops: <class 'ModuleNotFoundError'>: No module named "
            "'mmdet.core'") in result.stdout
