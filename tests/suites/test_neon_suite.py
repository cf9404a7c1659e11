"""The NEON tree-crown study (configs/suites/neon_trees_swin.py): every arm tuned alike on the selection seeds by
the validation tiles, the reported seeds tested on the held-out image and on nothing else, the arms differing only
in the conditioning, on the configs' own schedule."""
import os.path as osp

import torch
from mmdet.registry import MODELS
from mmengine.registry import init_default_scope
from mmengine.runner import set_random_seed

import condtok_mm  # noqa: F401  (registration)
from condtok_mm.suites.fingerprint import differences, fingerprint
from condtok_mm.suites.plan import resolved_config
from condtok_mm.suites.schema import load_suite
from helpers.repo import REPO_ROOT
from helpers.suite_stages import split_tested, stage, validated_epochs

NEON = osp.join(REPO_ROOT, 'configs', 'suites', 'neon_trees_swin.py')
ARMS = ('A_baseline', 'B_conditioned', 'D_norm_matched')
ANNOTATIONS = 'data/neon_trees/annotations/'
PILOT_SEED = 100  # the schedule pilot's (docs/en/studies/records/neon_pilot/)


def test_the_neon_suite_tunes_every_arm_alike_on_the_validation_tiles_and_reports_eight_seeds(tmp_path):
    suite = load_suite(NEON, REPO_ROOT)
    assert suite.selection_seeds == [0, 1] and suite.seeds == list(range(2, 10))
    assert PILOT_SEED not in suite.seeds + suite.selection_seeds
    assert suite.reference == 'A_baseline' and suite.family == ['B_conditioned', 'D_norm_matched']
    assert suite.extend_top and suite.metric == 'coco/bbox_mAP'
    selection, _ = stage(suite, 'select', tmp_path)
    assert [(c.variant, c.lr, c.seed) for c in selection] == [
        (variant, lr, seed) for seed in (0, 1) for variant in ARMS for lr in (5e-4, 1e-3, 2e-3)]
    assert all(not cell.test_options for cell in selection)
    for cell in selection:
        cfg = resolved_config(cell.config_path, cell.options)
        assert osp.basename(cell.checkpoint) == 'epoch_400.pth' and cell.warmup == 50
        assert cfg.train_cfg.max_epochs == 400
        assert validated_epochs(cfg.train_cfg) == list(range(20, 401, 20))
        assert cfg.param_scheduler[1]['milestones'] == [320, 380] and cfg.param_scheduler[1]['end'] == 400
        assert cfg.train_dataloader.dataset.ann_file == 'annotations/instances_train.json'
        # the rates are chosen on the selection cells' tests: the validation tiles, as the training validates on
        assert split_tested(cfg, ANNOTATIONS) == 'val'
        assert cfg.val_evaluator.ann_file == ANNOTATIONS + 'instances_val.json'
    # the arms of one seed and rate differ only in the conditioning (the backbone and its data preprocessor)
    cells = {(c.variant, c.lr, c.seed): c for c in selection}
    baseline = fingerprint(cells['A_baseline', 1e-3, 0], REPO_ROOT)
    for arm in ARMS[1:]:
        changed = sorted({line.split(':')[0] for line in differences(baseline, fingerprint(cells[arm, 1e-3, 0],
                                                                                         REPO_ROOT))
                          if line.startswith('config ')})
        assert changed and all(key.startswith(('config model.backbone.', 'config model.data_preprocessor.'))
                               for key in changed), (arm, changed)
    for cell in selection:
        cell.results = dict(metrics={'coco/bbox_mAP': 0.05 + 10 * cell.lr}, status='ran')  # best at the top
    extension, _ = stage(suite, 'extend', tmp_path, selection)
    assert {(c.variant, c.lr) for c in extension} == {(arm, 4e-3) for arm in ARMS}
    reported, unknown = stage(suite, 'report', tmp_path, selection)
    assert not unknown and len(reported) == 24
    for cell in reported:  # only the reported cells' tests read the held-out image
        test_cfg = resolved_config(cell.config_path, [*cell.options, *cell.test_options])
        assert split_tested(test_cfg, ANNOTATIONS) == 'test'
        train_cfg = resolved_config(cell.config_path, cell.options)
        assert split_tested(train_cfg, ANNOTATIONS) == 'val'
        assert train_cfg.val_evaluator.ann_file == ANNOTATIONS + 'instances_val.json'


def test_the_three_neon_arms_start_from_the_same_weights_on_a_seed():
    """What the runner does before training (a seeded model build and init_weights) gives every arm the same
    state dict: the conditioner adds no parameter and draws no random number."""
    suite = load_suite(NEON, REPO_ROOT)
    init_default_scope('mmdet')
    weights = {}
    for name, variant in suite.variants.items():
        cfg = resolved_config(variant.config_path, [*suite.options, *variant.options])
        set_random_seed(5)
        model = MODELS.build(cfg.model)
        model.init_weights()
        weights[name] = model.state_dict()
    reference = weights['A_baseline']
    for name in ARMS[1:]:
        assert weights[name].keys() == reference.keys(), name
        assert all(torch.equal(weights[name][key], reference[key]) for key in reference), name
