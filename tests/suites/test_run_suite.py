"""tools/suites/run_suite.py: suite files, the commands of each launcher, the gathered statistics, and
end-to-end runs (a finished run, resumed as it is, into another suite's out dir and with a changed variant; the
shipped dose suite); tests/suites/test_run_suite_processes.py has SIGINT to the runner and a run through SLURM."""
import hashlib
import json
import os
import os.path as osp
import shutil
import statistics
import sys

import numpy as np
import pytest
from scipy import stats

from condtok_mm.suites import launch as launching
from condtok_mm.suites.fingerprint import fingerprint
from condtok_mm.suites.launch import commands
from condtok_mm.suites.plan import STAGES, cells_of_stage
from condtok_mm.suites.results import cell_results
from condtok_mm.suites.schema import SuiteError, load_suite, phase_of
from helpers.repo import REPO_ROOT
from helpers.suite_runs import (BASELINE, CONDITIONED, record_fingerprints, run_runner, run_suite, suite_options, write_cell,
                        write_suite)


def suite_cells(suite, phase, args, cells=()):
    """The reported cells of a phase (a suite without selection seeds has no others)."""
    new, unknown = cells_of_stage(suite, phase, 'report', phase_of(suite), list(cells), args.out_dir,
                                  args.cfg_options)
    assert not unknown
    return new


# ---------------------------------------------------------------- suite files and commands (fast)

def test_every_cell_gets_its_seed_rate_and_options_in_order(tmp_path):
    suite = load_suite(write_suite(tmp_path / 's.py', dict(
        baseline=dict(config=BASELINE),
        scaled=dict(config=CONDITIONED, cfg_options={'model.backbone.conditioning.control': 'scale_matched'},
                    lrs=[5e-4])), cfg_options={'train_cfg.max_epochs': 2, 'param_scheduler.1.milestones': [1]}),
        REPO_ROOT)
    args = run_suite.parse_args([suite.path, '--out-dir', str(tmp_path / 'out'), '--cfg-options', 'a.b=1'])
    cells = suite_cells(suite, 0, args)
    # seed-major: a study cut short keeps whole seeds
    assert [(c.seed, c.variant, c.lr) for c in cells] == [
        (0, 'baseline', 1e-3), (0, 'baseline', 2e-3), (0, 'scaled', 5e-4),
        (1, 'baseline', 1e-3), (1, 'baseline', 2e-3), (1, 'scaled', 5e-4)]
    scaled = cells[5]
    assert scaled.work_dir == str(tmp_path / 'out' / 'scaled' / 'lr0.0005' / 'seed1')
    # seed and rate first, then the suite's, the variant's and the command line's options (the last wins)
    assert scaled.options == ['randomness.seed=1', 'optim_wrapper.optimizer.lr=0.0005', 'train_cfg.max_epochs=2',
                              'param_scheduler.1.milestones=[1]',
                              'model.backbone.conditioning.control=scale_matched', 'a.b=1']
    assert scaled.checkpoint == str(tmp_path / 'out' / 'scaled' / 'lr0.0005' / 'seed1' / 'epoch_2.pth')


def launch(tmp_path, launcher, *extra):
    suite = load_suite(write_suite(tmp_path / 's.py', dict(baseline=dict(config=BASELINE)), seeds=[3],
                                   lrs=[1e-3], cfg_options={'train_cfg.max_epochs': 1}), REPO_ROOT)
    args = run_suite.parse_args([suite.path, '--out-dir', str(tmp_path / 'out'), '--launcher', launcher,
                                 '--jobs', '2', *extra])
    cell, = suite_cells(suite, 0, args)
    return cell, commands(cell, args, 1, REPO_ROOT)


def test_local_commands_are_mmdets_train_and_test_with_the_cpus_shared_out(tmp_path, monkeypatch):
    monkeypatch.setattr(launching, 'usable_cpus', lambda: 8)
    cell, (train, test, env) = launch(tmp_path, 'none')
    config, work_dir = osp.join(REPO_ROOT, BASELINE), cell.work_dir
    options = ['--cfg-options', 'randomness.seed=3', 'optim_wrapper.optimizer.lr=0.001', 'train_cfg.max_epochs=1']
    assert train == [sys.executable, osp.join(REPO_ROOT, 'tools', 'train.py'), config, '--work-dir', work_dir,
                     *options]
    assert test == [sys.executable, osp.join(REPO_ROOT, 'tools', 'test.py'), config,
                    osp.join(work_dir, 'epoch_1.pth'), '--work-dir', osp.join(work_dir, 'test'), *options]
    # 8 CPUs, 2 cells at a time; this checkout's condtok_mm first on the path, whatever package is installed
    assert env == dict(OMP_NUM_THREADS='4', MKL_NUM_THREADS='4',
                       PYTHONPATH=os.pathsep.join([REPO_ROOT, *filter(None, [os.environ.get('PYTHONPATH')])]))
    cell.resume = True
    args = run_suite.parse_args([str(tmp_path / 's.py'), '--out-dir', str(tmp_path / 'out')])
    assert commands(cell, args, 0, REPO_ROOT)[0][5] == '--resume'


def test_torchrun_commands_use_mmdets_dist_scripts_on_a_port_per_slot(tmp_path, monkeypatch):
    monkeypatch.setattr(launching, 'usable_cpus', lambda: 8)
    cell, (train, test, env) = launch(tmp_path, 'pytorch', '--nproc', '2')
    config, work_dir = osp.join(REPO_ROOT, BASELINE), cell.work_dir
    assert train[:6] == ['bash', osp.join(REPO_ROOT, 'tools', 'dist_train.sh'), config, '2', '--work-dir', work_dir]
    assert test[:7] == ['bash', osp.join(REPO_ROOT, 'tools', 'dist_test.sh'), config,
                        osp.join(work_dir, 'epoch_1.pth'), '2', '--work-dir', osp.join(work_dir, 'test')]
    assert env['PORT'] == '29501' and env['OMP_NUM_THREADS'] == '2' and env['PYTHON'] == sys.executable


def test_slurm_commands_use_mmdets_slurm_scripts(tmp_path):
    cell, (train, test, env) = launch(tmp_path, 'slurm', '--nproc', '16', '--partition', 'gpu')
    config, work_dir = osp.join(REPO_ROOT, BASELINE), cell.work_dir
    assert train[:6] == ['bash', osp.join(REPO_ROOT, 'tools', 'slurm_train.sh'), 'gpu', 'baseline-lr0.001-seed3',
                         config, work_dir]
    assert test[:8] == ['bash', osp.join(REPO_ROOT, 'tools', 'slurm_test.sh'), 'gpu', 'baseline-lr0.001-seed3', config,
                        osp.join(work_dir, 'epoch_1.pth'), '--work-dir', osp.join(work_dir, 'test')]
    assert env['GPUS'] == '16' and env['GPUS_PER_NODE'] == '8'


@pytest.mark.parametrize('variants, extra, message', [
    (dict(baseline=dict(config=BASELINE)), 'reference = "other"', "reference 'other' is not one of the variants"),
    (dict(baseline=dict(config='configs/none.py')), '', 'config configs/none.py does not exist'),
    (dict(baseline=dict(config=BASELINE, lr=[1])), '', "unknown key\\(s\\) lr; a variant has"),
    (dict(baseline=dict(config=BASELINE, lrs=dict(best_of='x'))), '', 'best_of=NAME\\) needs NAME'),
    (dict(baseline=dict(config=BASELINE), a=dict(config=BASELINE, lrs=dict(best_of='b')),
          b=dict(config=BASELINE, lrs=dict(best_of='a'))), '', 'best_of cycle a -> b -> a'),
    (dict(baseline=dict(config=BASELINE, cfg_options={'model': {'x': 1}})), '', 'model is a dict; give its keys'),
    (dict(baseline=dict(config=BASELINE)), 'sedes = [1]', "unknown key\\(s\\) sedes"),
])
def test_a_broken_suite_is_refused_naming_the_key(tmp_path, variants, extra, message):
    path = write_suite(tmp_path / 's.py', variants)
    with open(path, 'a') as f:
        f.write(extra + '\n')
    with pytest.raises(SuiteError, match=message):
        load_suite(path, REPO_ROOT)


SHIPPED_SUITES = sorted(f for f in os.listdir(osp.join(REPO_ROOT, 'configs', 'suites')) if f.endswith('.py'))


@pytest.mark.parametrize('name', SHIPPED_SUITES)
def test_a_shipped_suite_generates_a_train_and_a_test_per_cell(name, tmp_path):
    """What a COCO or GPU suite can be checked for here: its cells, commands, work dirs and final checkpoints."""
    path = osp.join(REPO_ROOT, 'configs', 'suites', name)
    suite = load_suite(path, REPO_ROOT)
    args = run_suite.parse_args([path, '--out-dir', str(tmp_path), '--launcher', 'slurm', '--partition', 'p',
                                 '--nproc', '16'])
    cells, unknown = [], []
    for stage in STAGES:
        new, waiting = cells_of_stage(suite, 0, stage, phase_of(suite), cells, args.out_dir, args.cfg_options)
        cells, unknown = cells + new, unknown + waiting
    # phase 0: every variant that does not take another's rate, each at least on the seeds it starts on
    first = [name for name, variant in suite.variants.items() if not variant.best_of]
    assert {cell.variant for cell in cells} == set(first) and suite.reference in first
    assert all(name in suite.variants and suite.variants[name].tuned for line in unknown
               for name in [line.split("'")[1]])  # only a rate chosen on the selection seeds can wait
    for cell in cells:
        train, test, _ = commands(cell, args, 0, REPO_ROOT)
        assert train[1].endswith('slurm_train.sh') and train[4] == osp.join(REPO_ROOT, cell.config)
        assert train[5] == cell.work_dir == str(tmp_path / cell.variant / f'lr{cell.lr:g}' / f'seed{cell.seed}')
        assert test[1].endswith('slurm_test.sh') and test[5] == cell.checkpoint
        assert f'randomness.seed={cell.seed}' in train and f'optim_wrapper.optimizer.lr={cell.lr!r}' in train


@pytest.mark.parametrize('name, checkpoint', [
    ('coco_controls_swin-t_1x.py', 'epoch_12.pth'), ('coco_controls_vitdet-b.py', 'iter_184375.pth'),
    ('coco_pairs_xcit.py', 'epoch_36.pth'), ('demo_controls_swin.py', 'epoch_4.pth')])
def test_the_final_checkpoint_follows_each_recipe(name, checkpoint, tmp_path):
    path = osp.join(REPO_ROOT, 'configs', 'suites', name)
    suite = load_suite(path, REPO_ROOT)
    args = run_suite.parse_args([path, '--out-dir', str(tmp_path)])
    cells = suite_cells(suite, 0, args)
    assert {osp.basename(cell.checkpoint) for cell in cells} == {checkpoint}



@pytest.mark.parametrize('config, package, checkpoint', [
    ('mmdet::swin/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py', 'mmdet', 'epoch_12.pth'),
    ('mmpretrain::resnet/resnet18_8xb32_in1k.py', 'mmpretrain', 'epoch_100.pth'),
    ('mmseg::swin/swin-tiny-patch4-window7-in1k-pre_upernet_8xb2-160k_ade20k-512x512.py', 'mmseg', 'iter_160000.pth')])
def test_a_variant_may_name_an_installed_packages_config(config, package, checkpoint, tmp_path):
    """PACKAGE::PATH, as a config's _base_ may name one: the tools get the installed file, not the name as a
    path."""
    from mmengine.utils import get_installed_path
    path = write_suite(tmp_path / 's.py', dict(baseline=dict(config=config)), seeds=[0], lrs=[1e-4])
    suite = load_suite(path, REPO_ROOT)
    installed = osp.join(get_installed_path(package if package != 'mmseg' else 'mmsegmentation'), '.mim', 'configs',
                         config.split('::')[1])
    assert suite.variants['baseline'].config_path == installed and osp.isfile(installed)
    args = run_suite.parse_args([path, '--out-dir', str(tmp_path / 'out')])
    cell, = suite_cells(suite, 0, args)
    assert cell.checkpoint == str(tmp_path / 'out' / 'baseline' / 'lr0.0001' / 'seed0' / checkpoint)
    train, test, _ = commands(cell, args, 0, REPO_ROOT)
    assert train[2] == test[2] == installed
    dry = run_runner(path, '--out-dir', str(tmp_path / 'out'), '--dry-run')
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert f'tools/train.py {installed} --work-dir' in dry.stdout


@pytest.mark.parametrize('config, message', [
    ('mmfoo::swin/x.py', "unknown package 'mmfoo'; a config is a path relative to the repository root or "
                         "PACKAGE::PATH with PACKAGE one of mmdet, mmpretrain, mmseg"),
    ('mmdet::swin/none.py', 'config mmdet::swin/none.py does not exist: no .*/mmdet/.mim/configs/swin/none.py in the '
                            'installed mmdet')])
def test_a_package_config_that_is_not_there_is_refused_naming_it(config, message, tmp_path):
    with pytest.raises(SuiteError, match=message):
        load_suite(write_suite(tmp_path / 's.py', dict(baseline=dict(config=config))), REPO_ROOT)


# ---------------------------------------------------------------- gathering (fast, on written runs)

def test_gathered_statistics_equal_a_hand_computation(tmp_path):
    rng = np.random.default_rng(0)
    out_dir = tmp_path / 'out'
    ap = {}
    for variant in ('baseline', 'cond'):
        for lr in (1e-3, 2e-3):
            for seed in (0, 1, 2):
                ap[variant, lr, seed] = (rng.uniform(0.05, 0.3), rng.uniform(0.05, 0.3))
                losses = ([4.0, 3.0, 2.5, 2.0, 1.8, 1.5, 1.3, 1.2] if (variant, lr, seed) != ('baseline', 2e-3, 1)
                          else [4.0, 3.0, 2.95, 2.9, 2.9, 2.85, 2.8, 2.8])
                write_cell(str(out_dir), variant, lr, seed, *ap[variant, lr, seed], losses)
    path = write_suite(tmp_path / 's.py', dict(baseline=dict(config=BASELINE), cond=dict(config=CONDITIONED)),
                       seeds=[0, 1, 2], lrs=[1e-3, 2e-3],
                       cfg_options={'train_cfg.max_epochs': 1, 'param_scheduler.0.end': 20})  # warm-up: 20 iterations
    record_fingerprints(path, out_dir)
    run_suite.main([path, '--out-dir', str(out_dir), '--gather-only'])
    summary = json.loads((out_dir / 'suite.json').read_text())
    rows = {(row['variant'], row['lr']): row for row in summary['rows']}
    for (variant, lr), row in rows.items():
        bbox = [100 * ap[variant, lr, seed][0] for seed in (0, 1, 2)]
        assert row['metrics']['coco/bbox_mAP']['mean'] == pytest.approx(np.mean(bbox))
        assert row['metrics']['coco/bbox_mAP']['std'] == pytest.approx(np.std(bbox, ddof=1))
        assert row['final_loss']['mean'] == pytest.approx(np.mean([2.8 if (variant, lr, s) == ('baseline', 2e-3, 1)
                                                                   else 1.2 for s in (0, 1, 2)]))
        if variant == 'cond':
            differences = [100 * (ap['cond', lr, s][1] - ap['baseline', lr, s][1]) for s in (0, 1, 2)]
            half = stats.t.ppf(0.975, 2) * np.std(differences, ddof=1) / np.sqrt(3)
            difference = row['difference']['coco/segm_mAP']
            assert (difference['mean'], difference['low'], difference['high']) == pytest.approx(
                (np.mean(differences), np.mean(differences) - half, np.mean(differences) + half))
    # plateau: the mean of the 5 losses from iteration 20; the falling runs' trailing mean of 5 reaches 0.8 x
    # 2.16 at iteration 80 (1.56), the stalling run's never gets below 0.8 x 2.92
    assert rows['baseline', 2e-3]['escape_iteration'] == {'0': 80, '1': None, '2': 80}
    assert rows['baseline', 2e-3]['escaped'] == [0, 2] and rows['baseline', 1e-3]['escaped'] == [0, 1, 2]
    # the best rate of each variant, and its paired difference to the reference's best rate
    best = {entry['variant']: entry for entry in summary['best']}
    for variant in ('baseline', 'cond'):
        means = {lr: np.mean([ap[variant, lr, s][0] for s in (0, 1, 2)]) for lr in (1e-3, 2e-3)}
        assert best[variant]['lr'] == max(means, key=means.get)
    reference_lr = best['baseline']['lr']
    differences = [100 * (ap['cond', best['cond']['lr'], s][0] - ap['baseline', reference_lr, s][0]) for s in (0, 1, 2)]
    assert best['cond']['difference']['coco/bbox_mAP']['mean'] == pytest.approx(np.mean(differences))
    table = (out_dir / 'suite.md').read_text()
    cond = rows['cond', 1e-3]['metrics']['coco/bbox_mAP']
    values = ' / '.join(f'{100 * ap["cond", 1e-3, s][0]:.1f}' for s in (0, 1, 2))
    assert f'| cond | 0.001 | 0, 1, 2 | {cond["mean"]:.1f} ± {cond["std"]:.1f} ({values}) |' in table
    for name in ('ap_vs_lr.png', 'seeds.png', 'loss.png', 'kappa.png'):
        assert (out_dir / name).read_bytes()[:4] == b'\x89PNG'


def test_best_of_variants_take_the_best_rate_of_their_source(tmp_path):
    out_dir = tmp_path / 'out'
    for lr, bbox in ((1e-3, 0.1), (2e-3, 0.2)):
        for seed in (0, 1):
            write_cell(str(out_dir), 'baseline', lr, seed, bbox + 0.01 * seed, 0.1, [2.0, 1.0])
    path = write_suite(tmp_path / 's.py', dict(baseline=dict(config=BASELINE),
                                               window=dict(config=CONDITIONED, lrs=dict(best_of='baseline'))),
                       cfg_options={'train_cfg.max_epochs': 1})
    suite = load_suite(path, REPO_ROOT)
    args = run_suite.parse_args([path, '--out-dir', str(out_dir)])
    first = suite_cells(suite, 0, args)
    for cell in first:
        cell.results = cell_results(cell, suite.escape)
    second = suite_cells(suite, 1, args, first)
    assert [(cell.variant, cell.lr, cell.seed) for cell in second] == [('window', 2e-3, 0), ('window', 2e-3, 1)]


def held_out_suite(tmp_path, extend_top=False, lrs=(1e-3, 2e-3)):
    path = tmp_path / 'held_out.py'
    path.write_text(f'reference = "baseline"\nseeds = [3, 4]\nselection_seeds = [0, 1]\nlrs = {list(lrs)!r}\n'
                    f'extend_top = {extend_top!r}\ncfg_options = {{"train_cfg.max_epochs": 1}}\n'
                    'held_out = {"test_dataloader.dataset.ann_file": "annotations/instances_test.json", '
                    '"test_evaluator.ann_file": "data/shapes/annotations/instances_test.json"}\n'
                    f'variants = {dict(baseline=dict(config=BASELINE), conditioned=dict(config=CONDITIONED))!r}\n')
    return load_suite(str(path), REPO_ROOT)


def test_only_the_reported_cells_are_tested_on_the_held_out_split(tmp_path):
    suite = held_out_suite(tmp_path)
    out_dir = tmp_path / 'out'
    selection, _ = cells_of_stage(suite, 0, 'select', phase_of(suite), [], str(out_dir), [])
    assert {cell.seed for cell in selection} == {0, 1} and not any(cell.test_options for cell in selection)
    for cell in selection:
        write_cell(str(out_dir), cell.variant, cell.lr, cell.seed, 0.1 if cell.lr == 1e-3 else 0.2, 0.1, [2.0, 1.0])
        cell.results = cell_results(cell, suite.escape)
    reported, unknown = cells_of_stage(suite, 0, 'report', phase_of(suite), selection, str(out_dir), [])
    assert not unknown and {(cell.variant, cell.lr, cell.seed) for cell in reported} == {
        (variant, 2e-3, seed) for variant in ('baseline', 'conditioned') for seed in (3, 4)}
    args = run_suite.parse_args([suite.path, '--out-dir', str(out_dir)])
    held_out = ['test_dataloader.dataset.ann_file=annotations/instances_test.json',
                'test_evaluator.ann_file=data/shapes/annotations/instances_test.json']
    for cell in reported:
        train, test, _ = commands(cell, args, 0, REPO_ROOT)
        assert test[-2:] == held_out and not set(held_out) & set(train)
        assert fingerprint(cell, REPO_ROOT)['test_options'] == held_out
    train, test, _ = commands(selection[0], args, 0, REPO_ROOT)
    assert test[test.index('--cfg-options'):] == train[train.index('--cfg-options'):]  # the config's own split
    assert 'test_options' not in fingerprint(selection[0], REPO_ROOT)  # other suites' fingerprints as they were


def test_no_rate_is_chosen_or_extended_while_a_selection_cell_has_not_finished(tmp_path):
    suite = held_out_suite(tmp_path, extend_top=True)
    out_dir = tmp_path / 'out'
    selection, _ = cells_of_stage(suite, 0, 'select', phase_of(suite), [], str(out_dir), [])
    for cell in selection:
        if (cell.variant, cell.lr, cell.seed) != ('conditioned', 1e-3, 1):  # that one failed
            write_cell(str(out_dir), cell.variant, cell.lr, cell.seed, 0.1, 0.1, [2.0, 1.0])
        cell.results = cell_results(cell, suite.escape)
    for stage in ('extend', 'report'):
        new, unknown = cells_of_stage(suite, 0, stage, phase_of(suite), selection, str(out_dir), [])
        assert unknown == ["variant 'conditioned': 1 of its 4 selection cells did not finish (failed, interrupted or "
                           'unreadable), and its rate is chosen on all of them: run them again (--resume) before '
                           'its reported seeds']
        assert {cell.variant for cell in new} <= {'baseline'}


@pytest.mark.parametrize('best_at_top, added', [(True, [4e-3]), (False, [])])
def test_extend_top_adds_one_doubling_only_where_the_best_rate_is_the_grids_top(tmp_path, best_at_top, added):
    suite = held_out_suite(tmp_path, extend_top=True)
    out_dir = tmp_path / 'out'
    selection, _ = cells_of_stage(suite, 0, 'select', phase_of(suite), [], str(out_dir), [])
    for cell in selection:
        top = cell.lr == 2e-3
        write_cell(str(out_dir), cell.variant, cell.lr, cell.seed,
                   0.2 if top == (best_at_top or cell.variant == 'baseline') else 0.1, 0.1, [2.0, 1.0])
        cell.results = cell_results(cell, suite.escape)
    extension, _ = cells_of_stage(suite, 0, 'extend', phase_of(suite), selection, str(out_dir), [])
    by_variant = {(cell.variant, cell.lr) for cell in extension}
    # the baseline is best at the top either way; the conditioned arm only where best_at_top
    assert by_variant == {('baseline', 4e-3)} | {('conditioned', lr) for lr in added}
    assert sorted({cell.seed for cell in extension}) == [0, 1]
    for cell in extension:  # the doubling wins for the baseline: it is then reported there
        write_cell(str(out_dir), cell.variant, cell.lr, cell.seed, 0.3 if cell.variant == 'baseline' else 0.05, 0.1,
                   [2.0, 1.0])
        cell.results = cell_results(cell, suite.escape)
    reported, _ = cells_of_stage(suite, 0, 'report', phase_of(suite), selection + extension, str(out_dir), [])
    assert {(cell.variant, cell.lr) for cell in reported} == {('baseline', 4e-3),
                                                              ('conditioned', 2e-3 if best_at_top else 1e-3)}


@pytest.mark.parametrize('extra, message', [
    ('held_out = {"test_evaluator.ann_file": "x.json"}', 'held_out tests the reported seeds on a split nothing is '
     'chosen on; it needs selection_seeds'),
    ('extend_top = True', 'True needs selection_seeds'),
    ('extend_top = 1\nselection_seeds = [0]', 'extend_top must be True or False'),
])
def test_a_held_out_split_or_an_extension_without_selection_seeds_is_refused(tmp_path, extra, message):
    path = write_suite(tmp_path / 's.py', dict(baseline=dict(config=BASELINE)), seeds=[3])
    with open(path, 'a') as f:
        f.write(extra.replace('\\n', '\n') + '\n')
    with pytest.raises(SuiteError, match=message):
        load_suite(path, REPO_ROOT)


# ---------------------------------------------------------------- end to end (slow)
# The cells train on a dataset of their own, smaller than the session's: 8 training images (2 iterations an
# epoch at 4 a batch) and 4 validation images, 64 x 64; most of a cell's time is starting its two processes.

def dose_suite(path, shapes):
    """configs/suites/demo_dose_swin.py at one seed, one rate and one epoch on ``shapes``."""
    path.write_text(f'_base_ = [{osp.join(REPO_ROOT, "configs", "suites", "demo_dose_swin.py")!r}]\n'
                    f'seeds = [0]\nlrs = [1e-3]\ncfg_options = {suite_options(shapes, 1)!r}\n')
    return str(path)


def end_to_end_options(shapes, tmp_path):
    """The options of every end-to-end cell below: the one-epoch dose suite's (its own merged into those of
    configs/suites/_base_/demo_4e.py), so that its baseline is the two-variant run's baseline."""
    from mmengine.config import Config
    return Config.fromfile(dose_suite(tmp_path / 'dose_options.py', shapes)).cfg_options.to_dict()


def two_variants(path, shapes, seeds=(0, 1), control='scale_matched'):
    """The end-to-end suite: the baseline and the conditioned tokens under a token-scale control, one rate."""
    return write_suite(path, dict(baseline=dict(config=BASELINE), scaled=dict(config=CONDITIONED, cfg_options={
        'model.backbone.conditioning.control': control})), seeds=seeds, lrs=(1e-3, ),
        cfg_options=end_to_end_options(shapes, path.parent))


@pytest.fixture(scope='module')
def finished_run(small_shapes, tmp_path_factory):
    """(suite file, out dir, the runner's result) of two variants x two seeds at one epoch, trained once for the
    tests below; a test that changes the out dir works on a copy (:func:`copy_of_run`)."""
    root = tmp_path_factory.mktemp('finished_run')
    path = two_variants(root / 's.py', small_shapes)
    return path, root / 'out', run_runner(path, '--out-dir', str(root / 'out'), '--jobs', '2')


def copy_of_run(finished_run, tmp_path):
    _, out_dir, _ = finished_run
    shutil.copytree(out_dir, tmp_path / 'out', symlinks=True)
    return tmp_path / 'out'


def checkpoint_times(out_dir, variants=('baseline', 'scaled'), seeds=(0, 1)):
    return {(variant, seed): os.stat(out_dir / variant / 'lr0.001' / f'seed{seed}' / 'epoch_1.pth').st_mtime
            for variant in variants for seed in seeds}


@pytest.mark.slow
def test_two_variants_two_seeds_one_epoch(finished_run):
    # One rate: choosing among rates is checked on written runs above and end to end by the shipped dose
    # suite's best_of phase below.
    _, out_dir, result = finished_run
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads((out_dir / 'suite.json').read_text())
    cells = {(c['variant'], c['lr'], c['seed']): c for c in summary['cells_detail']}
    assert len(cells) == 4 and all(c['status'] == 'ran' for c in cells.values())
    for (variant, lr, seed), cell in cells.items():
        work_dir = cell['work_dir']
        assert work_dir == str(out_dir / variant / f'lr{lr:g}' / f'seed{seed}')
        # the run's own files: the test epoch's metrics, the last loss and the rate of its scalars.json
        test_json, = [osp.join(root, f) for root, _, files in os.walk(osp.join(work_dir, 'test'))
                      for f in files if f.endswith('.json') and 'vis_data' not in root]
        metrics = json.load(open(test_json))
        scalars, = [osp.join(root, 'scalars.json') for root, _, files in os.walk(work_dir)
                    if 'scalars.json' in files and '/test/' not in root]
        records = [json.loads(line) for line in open(scalars)]
        losses = [r['loss'] for r in records if 'loss' in r]
        assert cell['results']['metrics']['coco/bbox_mAP'] == pytest.approx(100 * metrics['coco/bbox_mAP'])
        assert cell['results']['final_loss'] == losses[-1] and len(losses) == 2  # 8 images, batch 4, logged each
        assert [r['lr'] for r in records if 'lr' in r][-1] == pytest.approx(lr)
        kappas = cell['results']['kappa']['kappa/tokens_out_mean/stage0']['value']
        assert kappas  # the scale-matched tokens keep X's kappa: far above the conditioned bound of 2
        assert min(kappas) > 2
        # the seed reaches the run
        assert f'randomness.seed={seed}' in open(osp.join(work_dir, 'train.log')).readline()
        # the record names the checkpoint the cell was tested with by its digest, and where it ran
        record = json.load(open(osp.join(work_dir, 'suite_cell.json')))
        with open(osp.join(work_dir, 'epoch_1.pth'), 'rb') as f:
            assert record['checkpoint_sha256'] == hashlib.sha256(f.read()).hexdigest()
        assert record['cpu'] and record['commit']
    rows = {(row['variant'], row['lr']): row for row in summary['rows']}
    for lr in (1e-3, ):
        values = [cells['scaled', lr, s]['results']['metrics']['coco/segm_mAP'] for s in (0, 1)]
        assert rows['scaled', lr]['metrics']['coco/segm_mAP']['mean'] == pytest.approx(statistics.fmean(values))
        differences = [cells['scaled', lr, s]['results']['metrics']['coco/bbox_mAP']
                       - cells['baseline', lr, s]['results']['metrics']['coco/bbox_mAP'] for s in (0, 1)]
        assert rows['scaled', lr]['difference']['coco/bbox_mAP']['mean'] == pytest.approx(statistics.fmean(differences))
    assert '| scaled | 0.001 | 0, 1 |' in (out_dir / 'suite.md').read_text()


@pytest.mark.slow
def test_the_same_suite_is_refused_without_resume_and_resumed_reuses_every_cell(finished_run, tmp_path):
    path, _, _ = finished_run
    out_dir = copy_of_run(finished_run, tmp_path)
    summary = json.loads((out_dir / 'suite.json').read_text())
    refused = run_runner(path, '--out-dir', str(out_dir))
    assert refused.returncode != 0 and 'use --resume to continue them' in refused.stderr
    mtimes = checkpoint_times(out_dir)
    rerun = run_runner(path, '--out-dir', str(out_dir), '--resume')
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    again = json.loads((out_dir / 'suite.json').read_text())
    assert [c['status'] for c in again['cells_detail']] == ['reused'] * 4
    assert again['rows'] == summary['rows']
    assert checkpoint_times(out_dir) == mtimes


@pytest.mark.slow
def test_another_suite_resumed_into_the_out_dir_stops_naming_the_cells_that_differ(finished_run, small_shapes,
                                                                                   tmp_path):
    """A past fault: suite B under suite A's names, resumed into A's out dir, reported A's numbers as B's ("reused")."""
    out_dir = copy_of_run(finished_run, tmp_path)
    table = (out_dir / 'suite.md').read_bytes()
    other = write_suite(tmp_path / 'b.py', dict(baseline=dict(config=CONDITIONED), scaled=dict(
        config=CONDITIONED, cfg_options={'model.backbone.conditioning.control': 'scale_matched'})), seeds=(0, 1),
        lrs=(1e-3, ), cfg_options=end_to_end_options(small_shapes, tmp_path))
    result = run_runner(other, '--out-dir', str(out_dir), '--resume')
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    for seed in (0, 1):
        assert f'cell baseline lr 0.001 seed {seed} ({out_dir}/baseline/lr0.001/seed{seed}) is not the cell this ' \
               'suite asks for' in result.stderr
    assert "config model.backbone.type: 'SwinTransformer' recorded, 'CondSwinTransformer' now" in result.stderr
    assert 'cell scaled' not in result.stderr  # the same cell in both suites
    assert (out_dir / 'suite.md').read_bytes() == table  # nothing gathered, nothing trained
    assert not (out_dir / 'baseline' / 'lr0.001' / 'seed0.changed-1').exists()


@pytest.mark.slow
def test_a_variant_whose_options_changed_stops_and_rerun_changed_runs_it_again(finished_run, small_shapes,
                                                                               tmp_path):
    out_dir = copy_of_run(finished_run, tmp_path)
    changed = two_variants(tmp_path / 's.py', small_shapes, seeds=(0, ), control='norm_matched')
    mtimes = checkpoint_times(out_dir)
    result = run_runner(changed, '--out-dir', str(out_dir), '--resume')
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    assert 'error: 1 cell(s) under' in result.stderr
    assert f'cell scaled lr 0.001 seed 0 ({out_dir}/scaled/lr0.001/seed0) is not the cell' in result.stderr
    assert "config model.backbone.conditioning.control: 'scale_matched' recorded, 'norm_matched' now" in result.stderr
    assert ('options: -model.backbone.conditioning.control=scale_matched, '
            '+model.backbone.conditioning.control=norm_matched') in result.stderr
    assert checkpoint_times(out_dir) == mtimes
    rerun = run_runner(changed, '--out-dir', str(out_dir), '--resume', '--rerun-changed')
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    work_dir = out_dir / 'scaled' / 'lr0.001' / 'seed0'
    assert f'scaled lr 0.001 seed 0 changed: set aside to {work_dir}.changed-1; it runs again' in rerun.stdout
    summary = json.loads((out_dir / 'suite.json').read_text())
    assert {c['variant']: c['status'] for c in summary['cells_detail']} == dict(baseline='reused', scaled='ran')
    assert os.stat(f'{work_dir}.changed-1/epoch_1.pth').st_mtime == mtimes['scaled', 0]  # kept, not deleted
    assert 'model.backbone.conditioning.control=norm_matched' in (work_dir / 'train.log').read_text()
    recorded = json.loads((work_dir / 'suite_cell.json').read_text())
    assert recorded['config']['model']['backbone']['conditioning']['control'] == 'norm_matched'


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_the_shipped_dose_suite_runs_end_to_end_at_one_epoch(finished_run, small_shapes, tmp_path):
    """configs/suites/demo_dose_swin.py, which holds the methods suite (baseline, conditioned tokens, spectral
    conditioning, Token Graying) and two more strengths of each method, through the runner with one seed, one
    rate and one epoch: every variant trains with its own config and strength, each dose at its method's rate
    (a second phase), and is evaluated. Its baseline is the end-to-end run's, linked in as the suite file says
    to link the methods suite's cells: the same config, options, seed and rate, so the same fingerprint."""
    from mmengine.config import Config
    out_dir = tmp_path / 'out'
    out_dir.mkdir()
    os.symlink(finished_run[1] / 'baseline', out_dir / 'baseline')
    path = dose_suite(tmp_path / 'dose.py', small_shapes)
    result = run_runner(path, '--out-dir', str(out_dir), '--jobs', '2', '--resume')
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert 'phase 1' in result.stderr  # the doses wait for their methods' best rate
    shipped = Config.fromfile(osp.join(REPO_ROOT, 'configs', 'suites', 'demo_dose_swin.py')).variants
    summary = json.loads((out_dir / 'suite.json').read_text())
    cells = {c['variant']: c for c in summary['cells_detail']}
    assert list(cells) == list(shipped)
    assert {name: c['status'] for name, c in cells.items()} == {name: 'reused' if name == 'baseline' else 'ran'
                                                                for name in shipped}
    for name, cell in cells.items():
        assert (cell['lr'], cell['seed']) == (1e-3, 0)
        assert 0 <= cell['results']['metrics']['coco/bbox_mAP'] <= 100
        run, = [osp.join(cell['work_dir'], f) for f in os.listdir(cell['work_dir']) if f.endswith('_shapes.py')]
        assert osp.basename(run) == osp.basename(shipped[name]['config'])
        backbone = Config.fromfile(run).model.backbone
        for key, value in (shipped[name].get('cfg_options') or {}).items():  # the strength reached the run
            assert key.startswith('model.backbone.')
            part = backbone
            for field in key.split('.')[2:]:
                part = part[field]
            assert part == value, (name, key)
        if name.startswith('spectral'):
            assert backbone.type == 'SpectralAttentionBackbone'
        elif name.startswith(('condtok', 'graying')):
            assert backbone.conditioning.mode == ('graying' if name.startswith('graying') else 'sigma_max')
        else:
            assert 'conditioning' not in backbone
    assert '| graying_e0_6 | 0.001 | 0 |' in (out_dir / 'suite.md').read_text()
