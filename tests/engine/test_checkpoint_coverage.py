"""tools/test.py stops when the checkpoint leaves a large share of the model's parameters unloaded or mis-shaped
(condtok_mm.engine.hooks.checkpoint_coverage.check_checkpoint_covers_model), unless --allow-partial-checkpoint is given."""
import os.path as osp
import re
import subprocess
import sys

import pytest
import torch
from mmengine.config import Config
from mmengine.registry import init_default_scope
from mmengine.runner import Runner, save_checkpoint
from torch import nn

from helpers.cfg_options import cfg_options_dict, data_options
from helpers.repo import DEMO, REPO_ROOT

VITDET_DEMO = osp.join(REPO_ROOT, 'configs', 'demo', 'mask-rcnn_vit-mini-vitdet_simple-fpn_12e_shapes.py')


def build_model(config):
    import condtok_mm  # noqa: F401  (registration)
    from mmdet.registry import MODELS
    init_default_scope('mmdet')
    return MODELS.build(Config.fromfile(config).model)


def run_test_tool(checkpoint, shapes_root, tmp_path, *options):
    return subprocess.run([sys.executable, osp.join(REPO_ROOT, 'tools', 'test.py'), DEMO, checkpoint,
                           '--work-dir', str(tmp_path / 'test'), *options, '--cfg-options',
                           *data_options(shapes_root, 1)],
                          capture_output=True, text=True, timeout=600, cwd=REPO_ROOT)


@pytest.fixture(scope='module')
def vitdet_checkpoint(tmp_path_factory):
    """A checkpoint of the ViTDet demo model (freshly initialised), for the Swin demo config."""
    path = str(tmp_path_factory.mktemp('vitdet') / 'vitdet.pth')
    save_checkpoint({'state_dict': build_model(VITDET_DEMO).state_dict(), 'meta': {}}, path)
    return path


@pytest.mark.slow  # a fresh Python process (~10 s of imports on 2 cores)
def test_tools_test_stops_on_the_checkpoint_of_another_model(vitdet_checkpoint, shapes_root, tmp_path):
    result = run_test_tool(vitdet_checkpoint, shapes_root, tmp_path)
    assert result.returncode == 1, result.stderr[-3000:]
    assert re.search(f'error: the checkpoint {re.escape(vitdet_checkpoint)} leaves [0-9,]+ of the [0-9,]+ '
                     rf'parameters \([0-9.]+%\) of the model of {re.escape(DEMO)} unloaded: [0-9]+ of its [0-9]+ '
                     r'parameter tensors are missing from the checkpoint \(e\.g\. backbone\.', result.stderr), \
        result.stderr[-3000:]
    assert '--allow-partial-checkpoint' in result.stderr and 'Traceback' not in result.stderr


@pytest.mark.slow  # a fresh Python process that evaluates the 8 val images
def test_tools_test_evaluates_a_partial_checkpoint_when_asked(vitdet_checkpoint, shapes_root, tmp_path):
    result = run_test_tool(vitdet_checkpoint, shapes_root, tmp_path, '--allow-partial-checkpoint')
    assert result.returncode == 0, result.stderr[-3000:]
    assert 'coco/bbox_mAP' in result.stdout + result.stderr


@pytest.mark.slow
def test_the_check_passes_a_matching_checkpoint_and_stops_another_as_the_runner_loads_it(shapes_root, tmp_path):
    from condtok_mm.engine.hooks.checkpoint_coverage import CheckpointCoverageCheck, PartialCheckpointError
    cfg = Config.fromfile(DEMO)
    cfg.merge_from_dict(cfg_options_dict(data_options(shapes_root, 1)))
    cfg.work_dir = str(tmp_path)
    runner = Runner.from_cfg(cfg)
    runner.register_hook(CheckpointCoverageCheck('the checkpoint', DEMO), priority='LOWEST')  # as tools/test.py
    matching = str(tmp_path / 'swin.pth')
    save_checkpoint({'state_dict': runner.model.state_dict(), 'meta': {}}, matching)
    runner.load_checkpoint(matching)  # what runner.test() does with load_from
    other = str(tmp_path / 'other.pth')  # a hand-made checkpoint of other keys
    save_checkpoint({'state_dict': {'backbone.stem.weight': torch.zeros(8, 3, 3, 3)}, 'meta': {}}, other)
    with pytest.raises(PartialCheckpointError, match=f'leaves [0-9,]+ of the [0-9,]+ parameters \\(100.0%\\) of the '
                       f'model of {re.escape(DEMO)} unloaded'):
        runner.load_checkpoint(other)


class TwoLinears(nn.Module):
    """1000 + ``small`` weights, in two tensors."""

    def __init__(self, small):
        super().__init__()
        self.large = nn.Linear(1000, 1, bias=False)
        self.small = nn.Linear(small, 1, bias=False)


@pytest.mark.parametrize('small, leave_out, refused', [
    (10, 'small.weight', False),  # 10 of 1010 elements unloaded (0.99%): at most 1%
    (11, 'small.weight', True),  # 11 of 1011 (1.09%)
    (10, None, False)])
def test_a_checkpoint_is_refused_when_more_than_one_percent_of_the_parameters_is_missing(small, leave_out, refused):
    from condtok_mm.engine.hooks.checkpoint_coverage import PartialCheckpointError, check_checkpoint_covers_model
    model = TwoLinears(small)
    state_dict = {name: value for name, value in model.state_dict().items() if name != leave_out}
    if refused:
        with pytest.raises(PartialCheckpointError, match=re.escape(
                f'the checkpoint c.pth leaves 11 of the 1,011 parameters (1.1%) of the model of m.py unloaded: 1 '
                'of its 2 parameter tensors are missing from the checkpoint (e.g. small.weight). ')):
            check_checkpoint_covers_model(model, {'state_dict': state_dict}, 'c.pth', 'm.py')
    else:
        check_checkpoint_covers_model(model, {'state_dict': state_dict}, 'c.pth', 'm.py')


def test_mis_shaped_parameters_count_as_unloaded_and_module_prefixes_are_removed_as_mmengine_does():
    from condtok_mm.engine.hooks.checkpoint_coverage import PartialCheckpointError, check_checkpoint_covers_model, unloaded_parameters
    model = TwoLinears(20)
    # a DDP-saved checkpoint ('module.' keys, which Runner.load_checkpoint strips) whose small layer has 21 inputs
    state_dict = {'module.large.weight': torch.zeros(1, 1000), 'module.small.weight': torch.zeros(1, 21)}
    assert unloaded_parameters(model, state_dict) == ([], [('small.weight', (1, 20), (1, 21))])
    with pytest.raises(PartialCheckpointError, match=re.escape(
            'leaves 20 of the 1,020 parameters (2.0%) of the model of m.py unloaded: 1 have another shape in it '
            '(e.g. small.weight: [1, 20] in the model, [1, 21] in the checkpoint). ')):
        check_checkpoint_covers_model(model, state_dict, 'c.pth', 'm.py')  # a bare state dict, as zoos publish


@pytest.mark.parametrize('config', ['mask-rcnn_swin-mini-spectral_fpn_12e_shapes.py',
                                    'mask-rcnn_swin-mini-graying_fpn_12e_shapes.py'])
def test_a_wrapped_backbone_is_covered_by_its_own_checkpoint(config):
    # SpectralAttentionBackbone saves the wrapped backbone's keys (not `wrapped.`'s): the check reads the names
    # the state dict gives the parameters, as the checkpoint has them
    from condtok_mm.engine.hooks.checkpoint_coverage import check_checkpoint_covers_model, unloaded_parameters
    model = build_model(osp.join(REPO_ROOT, 'configs', 'demo', config))
    checkpoint = {'state_dict': model.state_dict()}
    assert unloaded_parameters(model, checkpoint) == ([], [])
    check_checkpoint_covers_model(model, checkpoint, 'its own checkpoint', config)


MALFORMED = {
    'a list': ([torch.ones(1)], "it is a list, where a dict of parameter names to tensors"),
    'state_dict None': ({'state_dict': None, 'meta': {}}, "its 'state_dict' is a NoneType, where a dict"),
    'non-tensor values': ({'state_dict': {'backbone.x': 'weights', 'neck.y': [1.0]}},
                          "2 entries of its 'state_dict' are not parameter names with tensors "
                          "\\(e.g. 'backbone.x': str, 'neck.y': list\\)"),
}


@pytest.mark.slow  # a fresh Python process each
@pytest.mark.parametrize('kind, allow_partial', [(kind, False) for kind in sorted(MALFORMED)] + [('a list', True)])
def test_tools_test_names_a_checkpoint_that_is_not_one_of_a_model(kind, allow_partial, shapes_root, tmp_path):
    content, message = MALFORMED[kind]
    path = str(tmp_path / 'malformed.pth')
    torch.save(content, path)
    result = run_test_tool(path, shapes_root, tmp_path, *(['--allow-partial-checkpoint'] if allow_partial else []))
    assert result.returncode == 1, result.stderr[-3000:]
    assert re.search(f'error: the checkpoint {re.escape(path)} is not a checkpoint of a model: {message}',
                     result.stderr), result.stderr[-3000:]
    assert 'Traceback' not in result.stderr
