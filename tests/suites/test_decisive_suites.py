"""The decisive experiment's suites (configs/suites/demo_decisive_{swin,vitdet}.py), its dose-response
at a held token scale (demo_dose_norm_swin.py) and the XCiT pairs: what they ask the runner to train, at which
rates and seeds, on which schedule and data, and that each arm's model builds and runs."""
import os.path as osp

import pytest
import torch
from mmdet.registry import MODELS

import condtok_mm  # noqa: F401  (registration)
from condtok_mm.suites.fingerprint import differences, fingerprint
from condtok_mm.suites.plan import STAGES, resolved_config
from condtok_mm.suites.schema import load_suite
from condtok_mm.conditioning import condition_number
from helpers.repo import REPO_ROOT
from helpers.suite_stages import split_tested, stage, validated_epochs
from helpers.tokens import random_tokens

SWIN = osp.join(REPO_ROOT, 'configs', 'suites', 'demo_decisive_swin.py')
VITDET = osp.join(REPO_ROOT, 'configs', 'suites', 'demo_decisive_vitdet.py')
DOSE = osp.join(REPO_ROOT, 'configs', 'suites', 'demo_dose_norm_swin.py')
LONG = osp.join(REPO_ROOT, 'configs', 'suites', 'demo_long_swin.py')


def test_the_swin_suite_reports_every_arm_on_seeds_3_to_8_with_a_at_the_rate_chosen_on_seeds_0_to_2(tmp_path):
    suite = load_suite(SWIN, REPO_ROOT)
    assert suite.seeds == [3, 4, 5, 6, 7, 8] and not suite.selection_seeds
    assert suite.family == ['B_conditioned', 'D_norm_matched', 'F_win'] and suite.reference == 'A_baseline'
    assert not stage(suite, 'select', tmp_path)[0]
    reported, unknown = stage(suite, 'report', tmp_path)
    assert not unknown
    assert [(c.variant, c.lr, c.seed) for c in reported] == [
        (variant, lr, seed) for seed in range(3, 9)
        for variant, lr in (('A_baseline', 2.5e-4), ('B_conditioned', 1e-3), ('D_norm_matched', 1e-3),
                            ('F_win', 1e-3))]


@pytest.mark.parametrize('path', [SWIN, VITDET, DOSE])
def test_every_cell_trains_the_demos_12_epochs_and_evaluates_on_200_images_at_epochs_3_6_and_12(path, tmp_path):
    suite = load_suite(path, REPO_ROOT)
    cells = [cell for name in STAGES for cell in stage(suite, name, tmp_path)[0]]
    for cell in cells:
        cfg = resolved_config(cell.config_path, cell.options)
        assert osp.basename(cell.checkpoint) == 'epoch_12.pth' and cell.warmup == 100
        assert cfg.train_cfg.max_epochs == 12 and validated_epochs(cfg.train_cfg) == [3, 6, 12]
        assert [s['type'] for s in cfg.param_scheduler] == ['LinearLR', 'MultiStepLR']
        assert cfg.param_scheduler[1]['milestones'] == [9, 11]  # the demo's own decay
        for loader in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
            assert cfg[loader].dataset.data_root == 'data/shapes_val200/'
        assert cfg.test_evaluator.ann_file == 'data/shapes_val200/annotations/instances_val.json'
        assert cfg.default_hooks.checkpoint.interval == 1  # an interrupted cell resumes from its last epoch
    # the 200 validation images: the command the suite files give
    for line in open(path):
        if 'make_shapes.py' in line:
            assert '--out-dir data/shapes_val200/ --num-val 200' in line


def test_the_vitdet_suite_runs_a_b_d_at_fixed_rates_on_three_fresh_seeds(tmp_path):
    suite = load_suite(VITDET, REPO_ROOT)
    cells, unknown = stage(suite, 'report', tmp_path)
    assert not unknown and not stage(suite, 'select', tmp_path)[0]
    assert [(c.variant, c.lr, c.seed) for c in cells] == [
        (variant, lr, seed) for seed in (3, 4, 5)
        for variant, lr in (('A_baseline', 2.5e-4), ('B_conditioned', 1e-3), ('D_norm_matched', 1e-3))]


@pytest.mark.parametrize('path, variant, expected', [
    (SWIN, 'A_baseline', None),
    (SWIN, 'B_conditioned', dict(position='embedding', scope='image', control=None)),
    (SWIN, 'D_norm_matched', dict(position='embedding', scope='image', control='norm_matched')),
    (SWIN, 'F_win', dict(position='attention_input', scope='window', control=None)),
    (VITDET, 'D_norm_matched', dict(position='embedding', scope='image', control='norm_matched'))])
def test_each_arm_builds_the_model_it_names_and_runs_it(path, variant, expected, tmp_path):
    suite = load_suite(path, REPO_ROOT)
    cell = next(cell for name in STAGES for cell in stage(suite, name, tmp_path)[0] if cell.variant == variant)
    backbone = resolved_config(cell.config_path, cell.options).model.backbone
    if expected is None:
        assert 'conditioning' not in backbone
    else:
        conditioning = backbone.conditioning
        assert {key: conditioning.get(key, default) for key, default in (
            ('position', 'embedding'), ('scope', 'image'), ('control', None))} == expected
    model = MODELS.build(backbone)
    model.eval()
    with torch.no_grad():
        outputs = model(torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(0)))
    assert all(torch.isfinite(output).all() for output in outputs)


# (variant, rate, mode, target kappa, control, reference) of the dose suite, in its order
DOSE_ARMS = [
    ('D_norm_matched', 1e-3, 'sigma_max', 2.0, 'norm_matched', None),
    ('norm_k1_25', 1e-3, 'sigma_max', 1.25, 'norm_matched', 'D_norm_matched'),
    ('norm_k8', 1e-3, 'sigma_max', 8.0, 'norm_matched', 'D_norm_matched'),
    ('D_norm_matched_lr5e_4', 5e-4, 'sigma_max', 2.0, 'norm_matched', None),
    ('norm_k1_25_lr5e_4', 5e-4, 'sigma_max', 1.25, 'norm_matched', 'D_norm_matched_lr5e_4'),
    ('norm_k8_lr5e_4', 5e-4, 'sigma_max', 8.0, 'norm_matched', 'D_norm_matched_lr5e_4'),
    ('graying_norm', 1e-3, 'graying', None, 'norm_matched', 'D_norm_matched'),
]

def test_the_dose_suite_reports_every_dose_at_rates_fixed_in_advance_and_reuses_the_decisive_d(tmp_path):
    suite = load_suite(DOSE, REPO_ROOT)
    cells, unknown = stage(suite, 'report', tmp_path)
    assert not unknown and not stage(suite, 'select', tmp_path)[0]  # no rate is chosen: every arm is reported
    assert suite.family == ['norm_k1_25', 'norm_k8', 'norm_k1_25_lr5e_4', 'norm_k8_lr5e_4', 'graying_norm']
    assert [(c.variant, c.lr, c.seed) for c in cells] == [
        (arm[0], arm[1], seed) for seed in (3, 4, 5) for arm in DOSE_ARMS]
    for name, lr, mode, kappa, control, reference in DOSE_ARMS:
        assert suite.variants[name].reference == reference
        cell = next(c for c in cells if c.variant == name)
        conditioning = resolved_config(cell.config_path, cell.options).model.backbone.conditioning
        assert (conditioning['mode'], conditioning.get('control')) == (mode, control)
        if kappa is not None:
            assert conditioning.get('target_kappa', 2.0) == kappa
    # D is the decisive study's cell: the same fingerprint, so that copied in it is reused
    decisive = load_suite(SWIN, REPO_ROOT)
    decisive_cells = {(c.variant, c.seed): c for c in stage(decisive, 'report', tmp_path)[0]}
    for cell in cells:
        if cell.variant == 'D_norm_matched':
            assert fingerprint(cell, REPO_ROOT) == fingerprint(decisive_cells[cell.variant, cell.seed], REPO_ROOT)


def test_the_norm_matched_doses_keep_the_token_scale_which_without_the_control_grows_as_kappa_falls(tmp_path):
    suite = load_suite(DOSE, REPO_ROOT)
    cells = {c.variant: c for c in stage(suite, 'report', tmp_path)[0]}
    x = random_tokens(2, 49, 24, 1e3, dtype=torch.float64)  # kappa 1e3, as embedded tokens are ill-conditioned
    plain_scale = {}
    for name, _, mode, kappa, control, _ in DOSE_ARMS:
        conditioning = resolved_config(cells[name].config_path, cells[name].options).model.backbone.conditioning
        out = MODELS.build(conditioning)(x)
        if kappa is not None:
            assert (condition_number(out) <= kappa * (1 + 1e-6)).all()
        assert (torch.linalg.matrix_norm(out) / torch.linalg.matrix_norm(x)).tolist() == pytest.approx(
            [1.0, 1.0], rel=1e-9)
        plain = MODELS.build({**conditioning, 'control': None})(x)
        plain_scale[name] = (torch.linalg.matrix_norm(plain) / torch.linalg.matrix_norm(x)).tolist()
    # as X + C, sigma_max lifts the small singular values to s_1 / t: the smaller t, the larger ||X + C||_F
    for b in range(2):
        assert plain_scale['norm_k8'][b] < plain_scale['D_norm_matched'][b] < plain_scale['norm_k1_25'][b]


def test_the_xcit_suite_pairs_each_conditioned_model_with_its_own_baseline_and_quotes_the_papers():
    suite = load_suite(osp.join(REPO_ROOT, 'configs', 'suites', 'coco_pairs_xcit.py'), REPO_ROOT)
    references = {name: variant.reference for name, variant in suite.variants.items()}
    assert references == dict(S12_baseline=None, S12_conditioned='S12_baseline', M24_baseline=None,
                              M24_conditioned='M24_baseline')
    for name, variant in suite.variants.items():
        arch = name.split('_')[0].lower()
        assert f'xcit-{arch}-p16' in variant.config  # the pair is one architecture
        if variant.reference:
            assert variant.config.replace('-condtok', '') == suite.variants[variant.reference].config
    assert suite.family == ['S12_conditioned', 'M24_conditioned']
    # /work/shared/PAPER.md: ours XCiT-S 44.9 -> 45.7, XCiT-M 45.7 -> 46.2; the spectral paper XCiT-S 44.9 -> 45.6
    assert 'XCiT-S 44.9 -> 45.7' in suite.description and 'XCiT-M 45.7 -> 46.2' in suite.description
    assert 'spectral-conditioning paper XCiT-S 44.9 -> 45.6' in suite.description


def test_the_long_suite_runs_the_decisive_arms_for_36_epochs_with_the_baseline_at_both_rates(tmp_path):
    suite = load_suite(LONG, REPO_ROOT)
    assert suite.seeds == [3, 4, 5, 6, 7, 8] and not suite.selection_seeds and suite.reference == 'A_baseline'
    assert not stage(suite, 'select', tmp_path)[0]
    cells, unknown = stage(suite, 'report', tmp_path)
    assert not unknown
    assert [(c.variant, c.lr, c.seed) for c in cells] == [
        (variant, lr, seed) for seed in range(3, 9)
        for variant, lr in (('A_baseline', 2.5e-4), ('A_baseline', 1e-3), ('B_conditioned', 1e-3),
                            ('D_norm_matched', 1e-3))]
    decisive = {(c.variant, c.lr, c.seed): c for c in stage(load_suite(SWIN, REPO_ROOT), 'report', tmp_path)[0]}
    for cell in cells:
        cfg = resolved_config(cell.config_path, cell.options)
        assert osp.basename(cell.checkpoint) == 'epoch_36.pth' and cell.warmup == 100
        assert cfg.train_cfg.max_epochs == 36 and validated_epochs(cfg.train_cfg) == [6, 12, 18, 24, 30, 36]
        assert cfg.param_scheduler[1]['milestones'] == [27, 33] and cfg.param_scheduler[1]['end'] == 36
        assert cfg.default_hooks.checkpoint.interval == 1 and cfg.custom_hooks[0]['interval'] == 100
        assert cfg.test_evaluator.ann_file == 'data/shapes_val200/annotations/instances_val.json'
        # the decisive study's cell of the same arm and seed, but for the schedule
        twin = decisive.get((cell.variant, cell.lr, cell.seed))
        if twin is not None:
            recorded = fingerprint(twin, REPO_ROOT)
            lines = differences(recorded, fingerprint(cell, REPO_ROOT))
            changed = sorted(line.split(':')[0] for line in lines if line.startswith('config '))
            assert changed == ['config custom_hooks', 'config param_scheduler', 'config train_cfg.dynamic_intervals',
                               'config train_cfg.max_epochs', 'config train_cfg.val_interval'], lines


CONFIRM = osp.join(REPO_ROOT, 'configs', 'suites', 'demo_confirm_swin.py')


def test_the_confirmatory_suite_tunes_every_arm_alike_on_seeds_0_1_and_reports_on_twelve_new_seeds(tmp_path):
    suite = load_suite(CONFIRM, REPO_ROOT)
    assert suite.selection_seeds == [0, 1] and suite.seeds == list(range(9, 21))
    assert not set(suite.seeds) & set(range(9))  # no seed of an earlier study's choice or report
    assert suite.reference == 'A_baseline' and suite.family == ['B_conditioned', 'D_norm_matched']
    assert suite.extend_top
    selection, _ = stage(suite, 'select', tmp_path)
    assert [(c.variant, c.lr, c.seed) for c in selection] == [
        (variant, lr, seed) for seed in (0, 1) for variant in ('A_baseline', 'B_conditioned', 'D_norm_matched')
        for lr in (5e-4, 1e-3, 2e-3, 4e-3)]
    assert all(not cell.test_options for cell in selection)
    data = 'data/shapes_test500/annotations/'
    for cell in selection:
        cfg = resolved_config(cell.config_path, cell.options)
        assert osp.basename(cell.checkpoint) == 'epoch_36.pth' and cell.warmup == 100
        assert cfg.train_cfg.max_epochs == 36 and validated_epochs(cfg.train_cfg) == [6, 12, 18, 24, 30, 33, 36]
        assert cfg.param_scheduler[1]['milestones'] == [27, 33] and cfg.param_scheduler[1]['end'] == 36
        assert cfg.train_dataloader.dataset.data_root == 'data/shapes_test500/'
        # the rates are chosen on the selection cells' tests: the validation images, as the training validates on
        assert split_tested(cfg, data) == 'val' and cfg.val_evaluator.ann_file == data + 'instances_val.json'
    for cell in selection:
        cell.results = dict(metrics={'coco/bbox_mAP': 20.0 + 1000 * cell.lr}, status='ran')  # best at the top
    extension, _ = stage(suite, 'extend', tmp_path, selection)
    assert {(c.variant, c.lr) for c in extension} == {(v, 8e-3) for v in ('A_baseline', 'B_conditioned',
                                                                           'D_norm_matched')}
    reported, unknown = stage(suite, 'report', tmp_path, selection)
    assert not unknown and len(reported) == 36
    for cell in reported:  # only the reported cells' tests read the held-out split
        assert split_tested(resolved_config(cell.config_path, [*cell.options, *cell.test_options]), data) == 'test'
        train_cfg = resolved_config(cell.config_path, cell.options)
        assert split_tested(train_cfg, data) == 'val'
        assert train_cfg.val_evaluator.ann_file == data + 'instances_val.json'
