"""The suites of the comparison methods (configs/suites/demo_{methods,dose}_{swin,vitdet}.py): what they ask the suite
runner to train is what they say, at the published settings and the intended strengths."""
import functools
import os.path as osp

import pytest
from mmengine.config import Config

import condtok_mm  # noqa: F401
from condtok_mm.registry import MODELS
from helpers.repo import REPO_ROOT

SUITE_KEYS = {'reference', 'seeds', 'lrs', 'lr_key', 'metric', 'cfg_options', 'variants', 'description'}
FAMILIES = {'swin': ('configs/demo/mask-rcnn_swin-mini', '_fpn_12e_shapes.py'),
            'vitdet': ('configs/demo/mask-rcnn_vit-mini-vitdet', '_simple-fpn_12e_shapes.py')}
SUITES = [f'configs/suites/demo_{kind}_{family}.py' for kind in ('methods', 'dose') for family in FAMILIES]
# The strength knob of each method, where a dose suite turns it
KNOBS = {'condtok': 'model.backbone.conditioning.target_kappa', 'spectral': 'model.backbone.lam',
         'graying': 'model.backbone.conditioning.epsilon'}


def family_of(path):
    return path.rsplit('_', 1)[-1][:-len('.py')]


@functools.lru_cache(maxsize=None)
def suite(path):
    return Config.fromfile(osp.join(REPO_ROOT, path)).to_dict()


@functools.lru_cache(maxsize=None)
def model_config(path):
    return Config.fromfile(osp.join(REPO_ROOT, path))


def cell(variant):
    """The variant's config with the variant's cfg_options applied, as the runner's --cfg-options do."""
    cfg = copy_of(model_config(variant['config']))
    cfg.merge_from_dict(variant.get('cfg_options') or {})
    return cfg


def copy_of(cfg):
    return Config(cfg.to_dict())


def lookup(cfg, key):
    value = cfg.to_dict()
    for part in key.split('.'):
        value = value[part]
    return value


@pytest.mark.parametrize('path', SUITES)
def test_suite_has_the_runners_keys_and_names_existing_configs_and_keys(path):
    s = suite(path)
    assert {key for key in s if not key.startswith('_')} == SUITE_KEYS  # the runner ignores _-prefixed keys
    assert s['reference'] in s['variants'] and list(s['variants'])[0] == s['reference']
    assert s['seeds'] == [0, 1, 2] and s['metric'] == 'coco/bbox_mAP'
    for name, variant in s['variants'].items():
        assert osp.exists(osp.join(REPO_ROOT, variant['config'])), (name, variant['config'])
        assert variant['description']
        lrs = variant.get('lrs')
        assert lrs is None or lrs == dict(best_of=name.split('_')[0]) or (family_of(path) == 'vitdet' and
                                                                         len(lrs) == 1), name
        config = model_config(variant['config'])
        lookup(config, s['lr_key'])  # the learning rate the runner sets exists
        for key in variant.get('cfg_options') or {}:
            lookup(config, key)  # a misspelt key would add a new one silently instead of changing the knob


@pytest.mark.parametrize('family', FAMILIES)
def test_methods_suite_compares_the_three_methods_at_their_published_settings(family):
    prefix, tail = FAMILIES[family]
    variants = suite(f'configs/suites/demo_methods_{family}.py')['variants']
    assert list(variants) == ['baseline', 'condtok', 'spectral', 'graying']
    assert [v['config'] for v in variants.values()] == [
        f'{prefix}{tail}', f'{prefix}-condtok{tail}', f'{prefix}-spectral{tail}', f'{prefix}-graying{tail}']
    assert not any(v.get('cfg_options') for v in variants.values())
    if family == 'swin':  # every rate for every method
        assert not any(v.get('lrs') for v in variants.values())
    else:  # each method at its best rate on the Swin (demo_methods_swin's recorded run), as the controls do
        assert {name: v['lrs'] for name, v in variants.items()} == dict(
            baseline=[2.5e-4], condtok=[1e-3], spectral=[5e-4], graying=[2e-3])
    condtok = cell(variants['condtok']).model.backbone.conditioning
    assert (condtok.mode, condtok.alpha, condtok.target_kappa) == ('sigma_max', 1.0, 2.0)
    assert cell(variants['spectral']).model.backbone.lam == 10.0
    graying = cell(variants['graying']).model.backbone.conditioning
    assert (graying.mode, graying.epsilon) == ('graying', 0.95)
    assert 'conditioning' not in cell(variants['baseline']).model.backbone


@pytest.mark.parametrize('family', FAMILIES)
def test_dose_suite_adds_strengths_of_each_method_at_its_published_settings_best_rate(family):
    methods = suite(f'configs/suites/demo_methods_{family}.py')['variants']
    variants = suite(f'configs/suites/demo_dose_{family}.py')['variants']
    assert {name: variants[name] for name in methods} == methods  # its published settings are the methods suite's
    doses = {}
    for name, variant in variants.items():
        if name == 'baseline':
            continue
        method = name.split('_')[0]
        cfg = cell(variant)
        if name != method:  # a dose: the method's config and rate, its strength alone changed
            assert variant['config'] == methods[method]['config'] and variant['lrs'] == dict(best_of=method)
            assert list(variant['cfg_options']) == [KNOBS[method]]
        doses.setdefault(method, []).append(lookup(cfg, KNOBS[method]))
        if method != 'spectral':  # the conditioner each dose builds accepts its strength
            MODELS.build(cfg.model.backbone.conditioning)
    assert {method: sorted(values) for method, values in doses.items()} == {
        'condtok': [1.25, 2.0, 8.0], 'spectral': [3.0, 10.0, 30.0], 'graying': [0.3, 0.6, 0.95]}
