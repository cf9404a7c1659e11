import glob
import os.path as osp
import re
import subprocess
import sys

import mmdet
import pytest
from mmengine.config import Config
from mmengine.runner import Runner

import condtok_mm  # noqa: F401
from helpers.repo import DEMO, REPO_ROOT
from condtok_mm.models import SpectralAttentionBackbone, TokenConditioner
from condtok_mm.utils import fall_back_from_amp_on_cpu


def rel(path):
    return osp.relpath(path, REPO_ROOT)


# configs/suites/ holds suites for tools/suites/run_suite.py (lists of configs), not model configs
CONFIGS = sorted(p for p in glob.glob(osp.join(REPO_ROOT, 'configs', '**', '*.py'), recursive=True)
                 if '_base_' not in p and osp.join('configs', 'suites') not in p)  # suites: run_suite.py's
# Conditioned configs that vary another conditioned config instead of having a baseline twin: each inherits
# the first and changes only the keys given (ablations for the suites of tools/suites/run_suite.py).
CONDITIONING_VARIANTS = {
    'configs/demo/mask-rcnn_swin-mini-condtok-floor_fpn_12e_shapes.py':
        ('configs/demo/mask-rcnn_swin-mini-condtok_fpn_12e_shapes.py', {'model.backbone.conditioning.mode': 'floor'}),
    # the pretrained-backbone protocols (docs/en/user_guides/protocols.md), each against its drop-in P1
    'configs/demo/mask-rcnn_swin-mini-condtok-pretrained-ramp_fpn_12e_shapes.py':
        ('configs/demo/mask-rcnn_swin-mini-condtok-pretrained_fpn_12e_shapes.py',
         {'custom_hooks': [dict(type='AttentionKappaHook', interval=50),
                           dict(type='ConditioningStrengthRampHook', length=100, shape='linear')]}),
    'configs/demo/mask-rcnn_swin-mini-condtok-pretrained-norm_fpn_12e_shapes.py':
        ('configs/demo/mask-rcnn_swin-mini-condtok-pretrained_fpn_12e_shapes.py',
         {'model.backbone.conditioning.control': 'norm_matched'}),
    'configs/demo/mask-rcnn_swin-mini-condtok-condpretrained_fpn_12e_shapes.py':
        ('configs/demo/mask-rcnn_swin-mini-condtok-pretrained_fpn_12e_shapes.py',
         {'model.backbone.init_cfg.checkpoint': 'work_dirs/swin-mini-condtok_1xb32-20e_shapes-cls/epoch_20.pth'}),
    'configs/swin/mask-rcnn_swin-t-p4-w7-condtok-ramp_fpn_1x_coco.py':
        ('configs/swin/mask-rcnn_swin-t-p4-w7-condtok_fpn_1x_coco.py',
         {'custom_hooks': [dict(type='AttentionKappaHook', interval=50),
                           dict(type='ConditioningStrengthRampHook', length=1000, shape='linear')]}),
    'configs/swin/mask-rcnn_swin-t-p4-w7-condtok-norm_fpn_1x_coco.py':
        ('configs/swin/mask-rcnn_swin-t-p4-w7-condtok_fpn_1x_coco.py',
         {'model.backbone.conditioning.control': 'norm_matched'}),
    'configs/neon/faster-rcnn_swin-mini-condtok-norm_fpn_400e_neon-trees.py':
        ('configs/neon/faster-rcnn_swin-mini-condtok_fpn_400e_neon-trees.py',
         {'model.backbone.conditioning.control': 'norm_matched'}),
}


CONDITIONED = [p for p in CONFIGS if 'condtok' in osp.basename(p) and osp.basename(p) != 'mask-rcnn_condtok.py'
               and rel(p) not in CONDITIONING_VARIANTS]


def without_scope(value):
    """Drop the `_scope_='mmdet'` marks that mmengine adds to what a `mmdet::` base defines."""
    if isinstance(value, dict):
        return {k: without_scope(v) for k, v in value.items() if k != '_scope_'}
    if isinstance(value, (list, tuple)):
        return type(value)(without_scope(v) for v in value)
    return value


def flatten(cfg, prefix=''):
    items = {}
    for key, value in without_scope(cfg).items():
        if isinstance(value, dict):
            items.update(flatten(value, f'{prefix}{key}.'))
        else:
            items[f'{prefix}{key}'] = value
    return items


def unwrapped(flat, base):
    """A CondTokBackbone or SpectralAttentionBackbone config seen as its baseline with the wrapper's own keys:
    checks that the wrapped backbone is exactly the baseline's backbone, then puts the baseline's backbone keys
    in its place."""
    if flat.get('model.backbone.type') not in ('CondTokBackbone', 'SpectralAttentionBackbone'):
        return flat
    prefix = 'model.backbone.backbone.'
    inner = {'model.backbone.' + k[len(prefix):]: v for k, v in flat.items() if k.startswith(prefix)}
    assert inner == {k: v for k, v in base.items() if k.startswith('model.backbone.')}
    outer = {k: v for k, v in flat.items() if not k.startswith(prefix)}
    return {**{k: v for k, v in inner.items() if k != 'model.backbone.type'}, **outer}


def baseline_of(path):
    return path.replace('-condtok', '')


@pytest.mark.parametrize('path', CONDITIONED, ids=rel)
def test_conditioned_config_differs_from_its_baseline_twin_only_in_the_conditioning(path):
    assert osp.exists(baseline_of(path)), f'{rel(path)} has no baseline twin {rel(baseline_of(path))}'
    base = flatten(Config.fromfile(baseline_of(path)).to_dict())
    ours = unwrapped(flatten(Config.fromfile(path).to_dict()), base)
    changed = {k for k in ours.keys() | base.keys() if ours.get(k, object()) != base.get(k, object())}
    where = {'CondSwinTransformer': 'model.backbone.condition_stages',
             'CondViT': 'model.backbone.condition_after_pos_embed',
             'CondTokBackbone': 'model.backbone.targets'}[ours['model.backbone.type']]
    # detection batches are padded: the conditioned twin records each image's valid region for the conditioner
    padded = {'model.data_preprocessor.type'} if base.get('model.data_preprocessor.type') == 'DetDataPreprocessor' \
        else set()
    assert changed == {'model.backbone.type', 'model.backbone.conditioning.type',
                       'model.backbone.conditioning.mode', 'model.backbone.conditioning.alpha',
                       'model.backbone.conditioning.target_kappa', 'model.backbone.conditioning.detach',
                       where} | padded
    if padded:
        assert ours['model.data_preprocessor.type'] == 'ValidRegionDetDataPreprocessor'


# The comparison methods, each config beside the baseline twin it differs from in the method's lines
# only: the spectral shift of attention (a wrapper with lambda) and Token Graying (the conditioner's mode).
METHOD_CONFIGS = [p for p in CONFIGS if re.search(r'-(spectral|graying)_', osp.basename(p))]


def test_every_model_family_has_both_methods():
    families = ('swin/mask-rcnn_swin-t', 'vitdet/mask-rcnn_vit-b', 'xcit/mask-rcnn_xcit-s12', 'xcit/mask-rcnn_xcit-m24',
                'demo/mask-rcnn_swin-mini', 'demo/mask-rcnn_vit-mini')
    for family in families:
        for method in ('spectral', 'graying'):
            assert [p for p in METHOD_CONFIGS if rel(p).startswith(f'configs/{family}') and f'-{method}_' in p], \
                (family, method)


@pytest.mark.parametrize('path', METHOD_CONFIGS, ids=rel)
def test_method_config_differs_from_its_baseline_twin_only_in_the_method(path):
    method = re.search(r'-(spectral|graying)_', osp.basename(path)).group(1)
    twin = path.replace(f'-{method}_', '_')
    assert osp.exists(twin), f'{rel(path)} has no baseline twin {rel(twin)}'
    base = flatten(Config.fromfile(twin).to_dict())
    ours = unwrapped(flatten(Config.fromfile(path).to_dict()), base)
    changed = {k for k in ours.keys() | base.keys() if ours.get(k, object()) != base.get(k, object())}
    if method == 'spectral':  # padding does not matter to W + lambda I
        assert changed == {'model.backbone.type', 'model.backbone.lam'}
        assert (ours['model.backbone.type'], ours['model.backbone.lam']) == ('SpectralAttentionBackbone', 10.0)
        return
    where = {'CondSwinTransformer': 'model.backbone.condition_stages',
             'CondViT': 'model.backbone.condition_after_pos_embed',
             'CondTokBackbone': 'model.backbone.targets'}[ours['model.backbone.type']]
    assert changed == {'model.backbone.type', 'model.backbone.conditioning.type', 'model.backbone.conditioning.mode',
                       'model.backbone.conditioning.epsilon', 'model.backbone.conditioning.detach', where,
                       'model.data_preprocessor.type'}
    assert (ours['model.backbone.conditioning.mode'], ours['model.backbone.conditioning.epsilon']) == ('graying', 0.95)
    assert ours['model.data_preprocessor.type'] == 'ValidRegionDetDataPreprocessor'


# Token Graying's DCT form beside its SVD form: the same config but for the conditioner's mode.
DCT_GRAYING_CONFIGS = [p for p in CONFIGS if '-graying-dct_' in osp.basename(p)]


def test_every_svd_graying_config_has_a_dct_twin():
    assert sorted(p.replace('-graying_', '-graying-dct_') for p in METHOD_CONFIGS if '-graying_' in p) == \
        sorted(DCT_GRAYING_CONFIGS)


@pytest.mark.parametrize('path', DCT_GRAYING_CONFIGS, ids=rel)
def test_dct_graying_config_differs_from_its_svd_twin_only_in_the_mode(path):
    twin = flatten(Config.fromfile(path.replace('-graying-dct_', '-graying_')).to_dict())
    ours = flatten(Config.fromfile(path).to_dict())
    changed = {k for k in ours.keys() | twin.keys() if ours.get(k, object()) != twin.get(k, object())}
    assert {k: ours[k] for k in changed} == {'model.backbone.conditioning.mode': 'graying_dct'}


@pytest.mark.parametrize('path', sorted(CONDITIONING_VARIANTS))
def test_conditioning_variant_differs_from_its_conditioned_config_only_in_the_keys_it_names(path):
    reference, expected = CONDITIONING_VARIANTS[path]
    assert osp.join(REPO_ROOT, path) in CONFIGS  # so that the parametrized tests above build it
    base = flatten(Config.fromfile(osp.join(REPO_ROOT, reference)).to_dict())
    ours = flatten(Config.fromfile(osp.join(REPO_ROOT, path)).to_dict())
    changed = {k for k in ours.keys() | base.keys() if ours.get(k, object()) != base.get(k, object())}
    assert {k: ours[k] for k in changed} == expected


def test_headline_config_is_mmdets_swin_mask_rcnn_plus_norm_matched_conditioning():
    ours = flatten(Config.fromfile(osp.join(REPO_ROOT, 'configs', 'mask-rcnn_condtok.py')).to_dict())
    mmdet_config = osp.join(osp.dirname(mmdet.__file__), '.mim', 'configs', 'swin',
                            'mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py')
    upstream = flatten(Config.fromfile(mmdet_config).to_dict())
    changed = {k for k in ours.keys() | upstream.keys() if ours.get(k, object()) != upstream.get(k, object())}
    # condtok_mm imported, the conditioning, the instrumentation (kappa hook, TensorBoard), FastCocoMetric
    assert {k for k in changed if not k.startswith('model.backbone.cond')} == {
        'custom_imports.imports', 'custom_imports.allow_failed_imports', 'model.backbone.type',
        'model.data_preprocessor.type',
        'custom_hooks', 'vis_backends', 'visualizer.vis_backends', 'val_evaluator.type', 'test_evaluator.type'}
    assert ours['custom_hooks'] == [dict(type='AttentionKappaHook', interval=50)]
    assert ours['model.backbone.conditioning.type'] == 'TokenConditioner'
    # the protocol the protocol study supports for unconditioned ImageNet weights (P1-norm), not the plain drop-in
    assert ours['model.backbone.conditioning.control'] == 'norm_matched'
    assert ours['model.data_preprocessor.type'] == 'ValidRegionDetDataPreprocessor'
    assert ours['val_evaluator.metric'] == ['bbox', 'segm']
    assert ours['val_evaluator.type'] == ours['test_evaluator.type'] == 'FastCocoMetric'


# The batch size (processes x images per process) each config's learning rate was set for, by where the config
# is: mmdet's COCO schedules are for 8 GPUs x 2 images (ViTDet's for 64 GPUs x 1 image), the demo's for 1 process
# x 4 images.
BASE_BATCH_SIZES = {'configs/mask-rcnn_condtok.py': 16, 'configs/swin/': 16, 'configs/xcit/': 16,
                    'configs/upernet/': 16, 'configs/vitdet/': 64,
                    'configs/demo/swin-mini_1xb32': 32, 'configs/demo/swin-mini-condtok_1xb32': 32, 'configs/demo/': 4, 'configs/neon/': 4, 'configs/classification/vit-base-p16': 4096,
                    'configs/classification/': 1024}


# Building a runner takes seconds on a CPU (the model, and yapf formatting its config once): `make test-quick`
# builds the demo's own config, `make test` every one.
BUILT_CONFIGS = [path if path == DEMO else pytest.param(path, marks=pytest.mark.slow) for path in CONFIGS]


@pytest.mark.parametrize('path', BUILT_CONFIGS, ids=rel)
def test_config_builds_its_runner_and_scales_the_lr_from_its_base_batch_size(path, tmp_path):
    # mmdet's tools/train.py --auto-scale-lr refuses a config without auto_scale_lr.enable.
    sizes = [size for prefix, size in BASE_BATCH_SIZES.items() if rel(path).startswith(prefix)]
    assert sizes, f'add the base batch size of {rel(path)} (its reference run) to BASE_BATCH_SIZES'
    base_batch_size = sizes[0]
    cfg = Config.fromfile(path)
    # every config registers our modules and opts in to the run-time fixes
    assert cfg.custom_imports == dict(imports=['condtok_mm', 'condtok_mm.compat.enable'], allow_failed_imports=False)
    assert cfg.auto_scale_lr == dict(enable=False, base_batch_size=base_batch_size)

    cfg.auto_scale_lr.enable = True  # what --auto-scale-lr does
    fall_back_from_amp_on_cpu(cfg)  # as the tools do (ViTDet's recipe asks for AMP)
    cfg.train_dataloader.batch_size = 3
    cfg.work_dir = str(tmp_path)
    # the model is built (mmdet's or mmpretrain's registry, by default_scope); weights are not loaded and the
    # data is not read: nothing is downloaded and COCO need not be here
    runner = Runner.from_cfg(cfg)
    conditioners = [m for m in runner.model.backbone.modules() if isinstance(m, TokenConditioner)]
    assert bool(conditioners) == ('condtok' in osp.basename(path) or '-graying' in osp.basename(path))
    assert isinstance(runner.model.backbone, SpectralAttentionBackbone) == ('-spectral_' in osp.basename(path))
    optim_wrapper = runner.build_optim_wrapper(runner.optim_wrapper)
    config_lrs = [group['lr'] for group in optim_wrapper.param_groups]
    runner.scale_lr(optim_wrapper, runner.auto_scale_lr)  # as Runner.train does
    scaled_lrs = [group['lr'] for group in optim_wrapper.param_groups]
    assert scaled_lrs == pytest.approx([lr * 3 / base_batch_size for lr in config_lrs])
    assert max(config_lrs) == cfg.optim_wrapper.optimizer.lr  # below it: layer-wise decayed groups


@pytest.mark.slow  # a fresh Python process (~10 s of imports on 2 cores)
@pytest.mark.parametrize('tool, arguments, missing', [
    ('train.py', [], 'data/coco/annotations/instances_train2017.json does not exist (train_dataloader.dataset'),
    ('test.py', ['epoch_12.pth'],
     'data/coco/annotations/instances_val2017.json does not exist (test_dataloader.dataset'),
], ids=['train', 'test'])
def test_the_tools_without_coco_stop_with_one_clear_message(tmp_path, tool, arguments, missing):
    result = subprocess.run(
        [sys.executable, osp.join(REPO_ROOT, 'tools', tool), osp.join(REPO_ROOT, 'configs', 'mask-rcnn_condtok.py'),
         *arguments, '--work-dir', str(tmp_path)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1
    assert 'Traceback' not in result.stderr
    assert f'COCO not found: {missing}' in result.stderr
    assert 'make demo' in result.stderr and 'ln -s /path/to/coco data/coco' in result.stderr


def test_vitdet_baseline_is_mmdets_published_recipe():
    # mmdet 3.3.0 projects/ViTDet/configs/vitdet_mask-rcnn_vit-b-mae_lsj-100e.py + lsj-100e_coco-instance.py
    cfg = Config.fromfile(osp.join(REPO_ROOT, 'configs', 'vitdet',
                                   'mask-rcnn_vit-b-vitdet_simple-fpn_lsj-100e_coco.py'))
    ours = flatten(cfg.to_dict())
    recipe = {
        'model.backbone.type': 'ViTDetViT', 'model.backbone.img_size': 1024, 'model.backbone.patch_size': 16,
        'model.backbone.embed_dim': 768, 'model.backbone.depth': 12, 'model.backbone.num_heads': 12,
        'model.backbone.drop_path_rate': 0.1, 'model.backbone.window_size': 14,
        'model.backbone.window_block_indexes': [0, 1, 3, 4, 6, 7, 9, 10], 'model.backbone.use_rel_pos': True,
        'model.backbone.norm_cfg.type': 'LN', 'model.backbone.init_cfg.type': 'Pretrained',
        'model.neck.type': 'ViTDetFPN', 'model.neck.in_channels': [192, 384, 768, 768],
        'model.neck.out_channels': 256, 'model.neck.num_outs': 5, 'model.neck.norm_cfg.type': 'ViTDetLN2d',
        'model.rpn_head.num_convs': 2, 'model.roi_head.bbox_head.type': 'Shared4Conv1FCBBoxHead',
        'model.roi_head.bbox_head.norm_cfg.type': 'ViTDetLN2d',
        'model.roi_head.mask_head.norm_cfg.type': 'ViTDetLN2d',
        'optim_wrapper.type': 'AmpOptimWrapper',
        'optim_wrapper.constructor': 'ViTDetLayerDecayOptimizerConstructor',
        'optim_wrapper.paramwise_cfg.decay_rate': 0.7, 'optim_wrapper.paramwise_cfg.num_layers': 12,
        'optim_wrapper.optimizer.type': 'AdamW', 'optim_wrapper.optimizer.lr': 1e-4,
        'optim_wrapper.optimizer.weight_decay': 0.1, 'train_cfg.type': 'IterBasedTrainLoop',
        'train_cfg.max_iters': 184375, 'train_dataloader.batch_size': 4, 'auto_scale_lr.base_batch_size': 64,
        'val_evaluator.metric': ['bbox', 'segm'],
    }
    assert {k: ours[k] for k in recipe} == recipe
    assert cfg.model.data_preprocessor.batch_augments == [
        dict(type='BatchFixedSizePad', size=(1024, 1024), pad_mask=True)]
    jitter = {t['type']: t for t in cfg.train_dataloader.dataset.pipeline}
    assert (jitter['RandomResize']['scale'], jitter['RandomResize']['ratio_range']) == ((1024, 1024), (0.1, 2.0))
    assert jitter['RandomCrop']['crop_size'] == (1024, 1024)
    assert [s['milestones'] for s in cfg.param_scheduler if s['type'] == 'MultiStepLR'] == [[163889, 177546]]
