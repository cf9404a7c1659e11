"""tools/benchmark/convergence.py: its schedule and overrides, its errors, and a short study end to end."""
import argparse
import importlib.util
import json
import os.path as osp
import re
import subprocess
import sys

import pytest

from conftest import REPO_ROOT

SCRIPT = osp.join(REPO_ROOT, 'tools', 'benchmark', 'convergence.py')
QUICK_DATALOADERS = ['train_dataloader.num_workers=0', 'train_dataloader.persistent_workers=False',
                     'val_dataloader.num_workers=0', 'val_dataloader.persistent_workers=False']


def load_script():
    spec = importlib.util.spec_from_file_location('convergence', SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_script(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=600,
                          cwd=REPO_ROOT)


# 6 epochs: 5.5 rounds to 6, the end of the run, and moves to 5; then 4.5 (rounded to 5) moves to 4.
@pytest.mark.parametrize('epochs, milestones', [(12, [9, 11]), (24, [18, 22]), (36, [27, 33]), (6, [4, 5]),
                                                (4, [2, 3]), (3, [1, 2]), (2, [1]), (1, [])])
def test_lr_decays_scale_with_the_epochs_and_stay_distinct_inside_the_run(epochs, milestones):
    assert load_script().scaled_milestones(epochs) == milestones


def test_run_options_reach_the_demo_schedule_hook_checkpoints_and_data(shapes_root):
    script = load_script()
    args = argparse.Namespace(seeds=[3], epochs=6, data_root=osp.join(shapes_root, ''),
                              cfg_options=['custom_hooks.0.interval=7'])
    cfg = script.resolved_config('condtok-floor', args)
    assert cfg.randomness.seed == 3 and cfg.train_cfg.max_epochs == cfg.train_cfg.val_interval == 6
    assert cfg.param_scheduler[0].end == 100  # the warm-up (iterations) is left alone
    assert cfg.param_scheduler[1].type == 'MultiStepLR'
    assert (cfg.param_scheduler[1].milestones, cfg.param_scheduler[1].end) == ([4, 5], 6)
    assert cfg.custom_hooks == [dict(type='AttentionConditioningHook', interval=7)]  # the user's option wins
    assert (cfg.default_hooks.checkpoint.interval, cfg.default_hooks.checkpoint.max_keep_ckpts) == (6, 1)
    assert cfg.model.backbone.conditioning.mode == 'floor'
    for split in ('train', 'val', 'test'):
        assert cfg[f'{split}_dataloader'].dataset.data_root == osp.join(shapes_root, '')
    assert cfg.val_evaluator.ann_file == cfg.test_evaluator.ann_file == osp.join(
        shapes_root, 'annotations', 'instances_val.json')


@pytest.mark.slow  # a fresh Python process (~10 s of imports on 2 cores)
def test_an_unknown_variant_is_refused_with_the_valid_ones():
    result = run_script('--variants', 'baseline', 'condtok-ceiling')
    assert result.returncode == 2
    assert "invalid choice: 'condtok-ceiling'" in result.stderr
    assert all(f"'{name}'" in result.stderr for name in ('baseline', 'condtok', 'condtok-floor'))


@pytest.mark.slow  # a fresh Python process (~10 s of imports on 2 cores)
def test_a_missing_dataset_is_refused_with_the_command_that_makes_it(tmp_path):
    data_root = str(tmp_path / 'no_shapes')
    result = run_script('--data-root', data_root, '--out-dir', str(tmp_path / 'out'))
    assert result.returncode == 2
    assert f'no shapes dataset at {data_root}' in result.stderr
    assert f'python tools/dataset/make_shapes.py --out-dir {data_root}' in result.stderr
    assert 'Traceback' not in result.stderr and not (tmp_path / 'out').exists()


@pytest.mark.slow
def test_two_variants_two_seeds_one_epoch(shapes_root, tmp_path):
    out_dir = tmp_path / 'convergence'
    args = ['--variants', 'baseline', 'condtok', '--seeds', '0', '1', '--epochs', '1', '--jobs', '2',
            '--data-root', shapes_root, '--out-dir', str(out_dir), '--cfg-options', *QUICK_DATALOADERS]
    result = run_script(*args)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

    table = (out_dir / 'convergence.md').read_text()
    number = r'\d+\.\d+ ± \d+\.\d+'
    for variant in ('baseline', 'condtok'):
        row = re.search(rf'^\| {variant}: .*\| 0, 1 \| (.*) \|$', table, re.MULTILINE)
        assert row, table
        assert len(re.findall(number, row.group(1))) == 5, row.group(0)  # 4 APs and the loss
    assert '1 epoch = 4 iterations per run' in table and 'torch ' in table and 'Command: `python ' in table
    assert '| baseline: ' in result.stdout  # the table is printed

    summary = json.loads((out_dir / 'convergence.json').read_text())
    runs = {(run['variant'], run['seed']): run for run in summary['runs']}
    assert sorted(runs) == [('baseline', 0), ('baseline', 1), ('condtok', 0), ('condtok', 1)]
    for run in runs.values():
        assert run['status'] == 'trained' and run['returncode'] == 0 and run['iterations'] == 4
        # the numbers are the run's own, as its text log prints them (4 decimals): AP after the epoch, last loss
        log = open(run['log']).read()
        for metric, key in (('bbox_AP', 'bbox_mAP'), ('bbox_AP50', 'bbox_mAP_50'), ('segm_AP', 'segm_mAP'),
                            ('segm_AP50', 'segm_mAP_50')):
            logged = re.findall(rf'coco/{key}: (\d+\.\d+)', log)
            assert run[metric] == pytest.approx(100 * float(logged[-1]), abs=0.01), metric
        assert run['final_loss'] == pytest.approx(float(re.findall(r' loss: (\d+\.\d+)', log)[-1]), abs=1e-4)
        assert osp.exists(osp.join(run['work_dir'], 'epoch_1.pth'))
    for variant in ('baseline', 'condtok'):
        aggregate = summary['variants'][variant]
        assert aggregate['seeds'] == [0, 1] and aggregate['bbox_AP']['n'] == 2
        assert aggregate['final_loss']['std'] >= 0

    # kappa of the tokens entering the first block: bounded by 2 with conditioning, far above without it
    def first_block_kappas(run):
        return run['curves']['tokens_out_stage0']['value']

    for seed in (0, 1):
        assert first_block_kappas(runs['condtok', seed]) and max(first_block_kappas(runs['condtok', seed])) <= 2.0001
        assert first_block_kappas(runs['baseline', seed]) and min(first_block_kappas(runs['baseline', seed])) > 2
    assert max(summary['variants']['condtok']['curves']['tokens_out_stage0']['max']) <= 2.0001
    assert min(summary['variants']['baseline']['curves']['tokens_out_stage0']['min']) > 2
    # the seed reaches the runs: the two initializations differ
    assert (runs['baseline', 0]['curves']['tokens_in_stage0']['value']
            != runs['baseline', 1]['curves']['tokens_in_stage0']['value'])
    for name in ('loss.png', 'kappa.png'):
        assert (out_dir / name).read_bytes()[:4] == b'\x89PNG'

    rerun = run_script(*args, '--skip-existing')
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    reused = json.loads((out_dir / 'convergence.json').read_text())
    assert [run['status'] for run in reused['runs']] == ['reused'] * 4
    assert [run['bbox_AP'] for run in reused['runs']] == [run['bbox_AP'] for run in summary['runs']]
