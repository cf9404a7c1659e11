"""The protocol suites (configs/suites/{demo_protocols_swin,coco_protocols_swin-t_1x}.py): the commands the suite
runner generates train what each protocol says, the protocol configs differ from P1 only in their protocol's keys,
and every fine-tuned arm starts from the same neck and head weights for a seed."""
import argparse
import os.path as osp

import pytest
import torch
from mmengine.config import Config, DictAction

import condtok_mm  # noqa: F401
import condtok_mm.compat
from condtok_mm.suites.launch import commands
from condtok_mm.suites.plan import final_checkpoint, make_cell, resolved_config
from condtok_mm.suites.schema import load_suite
from helpers.repo import REPO_ROOT
from helpers.suite_runs import run_suite
from helpers.pretrained import build, pretrained_classifier

DEMO_SUITE = 'configs/suites/demo_protocols_swin.py'
COCO_SUITE = 'configs/suites/coco_protocols_swin-t_1x.py'
ARMS = ['P0_baseline', 'P1_drop_in', 'P1_ramp', 'P1_norm', 'P2_conditioned_pretraining']
DEMO_CHECKPOINTS = {'unconditioned': 'work_dirs/swin-mini_1xb32-20e_shapes-cls/epoch_20.pth',
                    'conditioned': 'work_dirs/swin-mini-condtok_1xb32-20e_shapes-cls/epoch_20.pth'}
# the backbones the demo suite reads unless the environment names others: those published into its records
PUBLISHED = 'docs/en/studies/records/demo_protocols_swin/pretrained/'
SUITE_CHECKPOINTS = {'unconditioned': PUBLISHED + 'swin-mini_1xb32-20e_shapes-cls-43b2bc03.pth',
                     'conditioned': PUBLISHED + 'swin-mini-condtok_1xb32-20e_shapes-cls-f20e8f05.pth'}
# Each protocol config against P1's, the keys it changes (flattened as tests/test_configs.py flattens them)
DEMO_P1 = 'configs/demo/mask-rcnn_swin-mini-condtok-pretrained_fpn_12e_shapes.py'
COCO_P1 = 'configs/swin/mask-rcnn_swin-t-p4-w7-condtok_fpn_1x_coco.py'
PROTOCOL_VARIANTS = {
    'configs/demo/mask-rcnn_swin-mini-condtok-pretrained-ramp_fpn_12e_shapes.py': (DEMO_P1, {'custom_hooks': [
        dict(type='AttentionKappaHook', interval=50),
        dict(type='ConditioningStrengthRampHook', length=100, shape='linear')]}),
    'configs/demo/mask-rcnn_swin-mini-condtok-pretrained-norm_fpn_12e_shapes.py': (
        DEMO_P1, {'model.backbone.conditioning.control': 'norm_matched'}),
    'configs/demo/mask-rcnn_swin-mini-condtok-condpretrained_fpn_12e_shapes.py': (
        DEMO_P1, {'model.backbone.init_cfg.checkpoint': DEMO_CHECKPOINTS['conditioned']}),
    'configs/swin/mask-rcnn_swin-t-p4-w7-condtok-ramp_fpn_1x_coco.py': (COCO_P1, {'custom_hooks': [
        dict(type='AttentionKappaHook', interval=50),
        dict(type='ConditioningStrengthRampHook', length=1000, shape='linear')]}),
    'configs/swin/mask-rcnn_swin-t-p4-w7-condtok-norm_fpn_1x_coco.py': (
        COCO_P1, {'model.backbone.conditioning.control': 'norm_matched'}),
}


def generated(suite_path, tmp_path):
    """{variant: (train command, the cell's config as its train command resolves it)} of the first reported seed at the variant's
    first learning rate, from the suite runner's own functions (what --dry-run prints)."""
    suite = load_suite(osp.join(REPO_ROOT, suite_path), REPO_ROOT)
    args = run_suite.parse_args([suite_path, '--out-dir', str(tmp_path)])
    cells = {}
    for name, variant in suite.variants.items():
        lrs = variant.lrs or suite.lrs
        cell = make_cell(suite, name, lrs[0], suite.seeds[0], str(tmp_path), [])
        cell.checkpoint = final_checkpoint(resolved_config(cell.config_path, cell.options), cell.work_dir)
        train, _, _ = commands(cell, args, 0, REPO_ROOT)
        options = train[train.index('--cfg-options') + 1:]
        parser = argparse.ArgumentParser()
        parser.add_argument('--cfg-options', nargs='+', action=DictAction)
        cfg = Config.fromfile(train[2])
        cfg.merge_from_dict(parser.parse_args(['--cfg-options', *options]).cfg_options)
        cells[name] = (train, cfg)
    return suite, cells


def flatten(cfg, prefix=''):
    items = {}
    for key, value in cfg.items():
        if isinstance(value, dict):
            items.update(flatten(value, f'{prefix}{key}.'))
        else:
            items[f'{prefix}{key}'] = value
    return items


def ramp_hooks(cfg):
    return [hook for hook in cfg.custom_hooks if hook['type'] == 'ConditioningStrengthRampHook']


@pytest.mark.slow
def test_demo_suite_runs_each_protocol_from_its_pretrained_checkpoint(tmp_path):
    suite, cells = generated(DEMO_SUITE, tmp_path)
    assert list(suite.variants) == ARMS + ['scratch_conditioned'] and suite.reference == 'P0_baseline'
    assert (suite.selection_seeds, suite.seeds, suite.metric) == ([0, 1], list(range(3, 11)), 'coco/bbox_mAP')
    assert suite.lrs == [2.5e-4, 1e-3] and suite.variants['scratch_conditioned'].lrs == [1e-3]
    # P0, P1 and P2 choose their rates on the selection seeds; the remedies take P1's, so that their difference from
    # P1 is the remedy alone
    assert [name for name, variant in suite.variants.items() if variant.tuned] == [
        'P0_baseline', 'P1_drop_in', 'P2_conditioned_pretraining']
    assert {name: variant.best_of for name, variant in suite.variants.items() if variant.best_of} == {
        'P1_ramp': 'P1_drop_in', 'P1_norm': 'P1_drop_in'}
    # the declared comparisons: the primary endpoint P1 - P0 outside the family, Holm over the remedies against P1
    # and P2 against P0; the from-scratch reference compared with nothing
    assert {name: variant.reference for name, variant in suite.variants.items()} == {
        'P0_baseline': None, 'P1_drop_in': 'P0_baseline', 'P1_ramp': 'P1_drop_in', 'P1_norm': 'P1_drop_in',
        'P2_conditioned_pretraining': 'P0_baseline', 'scratch_conditioned': None}
    assert suite.family == ['P1_ramp', 'P1_norm', 'P2_conditioned_pretraining']
    assert (suite.early_loss, suite.escape.window) == (100, 50)
    for name, (train, cfg) in cells.items():
        lr = (suite.variants[name].lrs or suite.lrs)[0]
        assert f'randomness.seed={suite.seeds[0]}' in train and f'optim_wrapper.optimizer.lr={lr!r}' in train
        # the demo's own 12-epoch schedule on the decisive study's 200 val images, validated at epochs 3, 6 and
        # 12, every iteration's loss logged unsmoothed
        assert cfg.train_cfg.max_epochs == 12 and cfg.train_cfg.val_interval == 3
        assert cfg.train_cfg.dynamic_intervals == [(8, 100)]
        assert cfg.test_dataloader.dataset.data_root == 'data/shapes_val200/'
        assert cfg.test_evaluator.ann_file == 'data/shapes_val200/annotations/instances_val.json'
        assert [s.milestones for s in cfg.param_scheduler if s.type == 'MultiStepLR'] == [[9, 11]]
        assert (cfg.default_hooks.logger.interval, cfg.log_processor.window_size) == (1, 1)
        assert cfg.custom_hooks[0] == dict(type='AttentionKappaHook', interval=50)
        conditioning = cfg.model.backbone.get('conditioning')
        assert (conditioning is None) == (name == 'P0_baseline'), name
        if conditioning is not None:
            assert (conditioning.mode, conditioning.alpha, conditioning.target_kappa) == ('sigma_max', 1.0, 2.0)
            assert conditioning.get('control') == ('norm_matched' if name == 'P1_norm' else None), name
        assert [(h['length'], h['shape']) for h in ramp_hooks(cfg)] == ([(100, 'linear')] if name == 'P1_ramp' else [])
        checkpoint = (cfg.model.backbone.init_cfg or {}).get('checkpoint')
        assert checkpoint == {'scratch_conditioned': None, 'P2_conditioned_pretraining': SUITE_CHECKPOINTS['conditioned']
                              }.get(name, SUITE_CHECKPOINTS['unconditioned']), name
        assert checkpoint is None or osp.isfile(osp.join(REPO_ROOT, checkpoint))


def test_demo_suite_takes_the_checkpoints_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv('CONDTOK_PRETRAINED', '/ckpt/plain.pth')
    monkeypatch.setenv('CONDTOK_PRETRAINED_CONDITIONED', '/ckpt/conditioned.pth')
    _, cells = generated(DEMO_SUITE, tmp_path)
    paths = {name: cfg.model.backbone.init_cfg.checkpoint for name, (_, cfg) in cells.items() if name in ARMS}
    assert paths == dict.fromkeys(ARMS[:4], '/ckpt/plain.pth') | {'P2_conditioned_pretraining': '/ckpt/conditioned.pth'}


@pytest.mark.slow
def test_coco_suite_runs_the_protocols_on_the_swin_t_1x_pair(tmp_path, monkeypatch):
    suite, cells = generated(COCO_SUITE, tmp_path)
    assert list(suite.variants) == ARMS and suite.lrs == [5e-5, 1e-4, 2e-4]
    public = Config.fromfile(osp.join(REPO_ROOT, 'configs/swin/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py')).model.backbone
    for name, (_, cfg) in cells.items():
        backbone = cfg.model.backbone
        assert (backbone.get('conditioning') is None) == (name == 'P0_baseline'), name
        assert backbone.get('conditioning', {}).get('control') == ('norm_matched' if name == 'P1_norm' else None)
        assert [(h['length'], h['shape']) for h in ramp_hooks(cfg)] == ([(1000, 'linear')] if name == 'P1_ramp' else [])
        if name == 'P2_conditioned_pretraining':  # an mmpretrain checkpoint already has mmdet's Swin keys
            assert backbone.init_cfg.checkpoint == 'work_dirs/swin-tiny-condtok_16xb64_in1k/epoch_300.pth'
            assert backbone.convert_weights is False
        else:  # mmdet's public ImageNet Swin-T, the original repository's keys
            assert (backbone.init_cfg, backbone.convert_weights) == (public.init_cfg, True)
        assert cfg.train_cfg.max_epochs == 12
    monkeypatch.setenv('CONDTOK_P2_CHECKPOINT', '/ckpt/swin-t-condtok.pth')
    _, cells = generated(COCO_SUITE, tmp_path)
    assert cells['P2_conditioned_pretraining'][1].model.backbone.init_cfg.checkpoint == '/ckpt/swin-t-condtok.pth'


@pytest.mark.parametrize('path', sorted(PROTOCOL_VARIANTS))
def test_protocol_config_differs_from_p1_only_in_its_protocols_keys(path):
    reference, expected = PROTOCOL_VARIANTS[path]
    ours = flatten(Config.fromfile(osp.join(REPO_ROOT, path)).to_dict())
    base = flatten(Config.fromfile(osp.join(REPO_ROOT, reference)).to_dict())
    changed = {key for key in ours.keys() | base.keys() if ours.get(key, object()) != base.get(key, object())}
    assert {key: ours[key] for key in changed} == expected


@pytest.mark.slow
def test_every_fine_tuned_arm_starts_from_the_same_neck_and_heads_for_a_seed(tmp_path):
    condtok_mm.compat.apply()
    checkpoints = {kind: str(tmp_path / f'{kind}.pth') for kind in DEMO_CHECKPOINTS}
    pretrained_classifier('swin-mini_1xb32-20e_shapes-cls.py', checkpoints['unconditioned'])
    pretrained_classifier('swin-mini-condtok_1xb32-20e_shapes-cls.py', checkpoints['conditioned'])
    _, cells = generated(DEMO_SUITE, tmp_path)
    initial = {}
    for name, (_, cfg) in cells.items():
        if cfg.model.backbone.init_cfg:
            kind = 'conditioned' if name == 'P2_conditioned_pretraining' else 'unconditioned'
            cfg.model.backbone.init_cfg.checkpoint = checkpoints[kind]
        torch.manual_seed(cfg.randomness.seed)  # what the Runner's set_random_seed does before building the model
        detector = build(cfg.model, 'mmdet')
        detector.init_weights()
        initial[name] = {key: value for key, value in detector.state_dict().items() if not key.startswith('backbone.')}
    reference = initial['P0_baseline']
    for name in ARMS[1:]:
        assert initial[name].keys() == reference.keys()
        for key, value in reference.items():
            torch.testing.assert_close(initial[name][key], value, rtol=0, atol=0, msg=f'{name} {key}')
    # from scratch, the backbone's own random initialisation draws from the generator first: other head weights
    assert not torch.equal(initial['scratch_conditioned']['rpn_head.rpn_conv.weight'],
                           reference['rpn_head.rpn_conv.weight'])
