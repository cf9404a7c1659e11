"""For the suite runner's tests: suite files and the options of their end-to-end cells, suite cells written as a
suite run leaves them (for the tests of the runner's gathering, tools/suites/run_suite.py --gather-only,
without training anything), and the runner's command line run in the test's own process."""
import functools
import json
import os
import os.path as osp

from condtok_mm.suites import run_suite
from condtok_mm.suites.fingerprint import fingerprint, write_fingerprint
from condtok_mm.suites.plan import STAGES, cells_of_stage
from condtok_mm.suites.results import cell_results
from condtok_mm.suites.schema import load_suite, phase_of
from helpers.cfg_options import data_options
from helpers.repo import REPO_ROOT, run_main

SCRIPT = osp.join(REPO_ROOT, 'tools', 'suites', 'run_suite.py')
KAPPA_KEYS = ('kappa/tokens_out_mean/stage0', 'kappa/attn_input_mean/stage0')
FAKE_SLURM = osp.join(REPO_ROOT, 'tests', 'fake_slurm')
BASELINE = 'configs/demo/mask-rcnn_swin-mini_fpn_12e_shapes.py'
CONDITIONED = 'configs/demo/mask-rcnn_swin-mini-condtok_fpn_12e_shapes.py'
# the end-to-end cells: data loaded in the training process (no loader processes to start), a log line at every
# iteration, a kappa record at every second
QUICK = {'train_dataloader.num_workers': 0, 'train_dataloader.persistent_workers': False,
         'val_dataloader.num_workers': 0, 'val_dataloader.persistent_workers': False,
         'test_dataloader.num_workers': 0, 'test_dataloader.persistent_workers': False,
         'default_hooks.logger.interval': 1, 'custom_hooks.0.interval': 2}


def write_suite(path, variants, seeds=(0, 1), lrs=(1e-3, 2e-3), cfg_options=None, reference='baseline'):
    """A suite file at ``path`` (a pathlib.Path) with these variants, seeds, rates, options and reference."""
    path.write_text(f'reference = {reference!r}\nseeds = {list(seeds)!r}\nlrs = {list(lrs)!r}\n'
                    f'cfg_options = {cfg_options or {}!r}\nvariants = {variants!r}\n')
    return str(path)


def suite_options(shapes_root, epochs):
    """The test cells' data and schedule, as a suite's cfg_options (the demo's 12-epoch decays dropped)."""
    options = dict(option.split('=', 1) for option in data_options(shapes_root, epochs)
                   if not option.startswith('randomness.seed'))
    return {**options, **QUICK, 'param_scheduler.1.milestones': [epochs + 1], 'param_scheduler.0.end': 2}


def write_cell(out_dir, variant, lr, seed, bbox, segm, losses, kappa=None, every=10, validations=None):
    """A finished cell as mmengine writes it: training scalars.json (a loss every ``every`` iterations, kappa
    records with their iteration as 'step', a validation's bbox AP (fraction) for each {epoch: value} of
    ``validations`` with its epoch as 'step') and the test epoch's JSON; bbox None leaves the cell untested."""
    work_dir = osp.join(out_dir, variant, f'lr{lr:g}', f'seed{seed}')
    os.makedirs(osp.join(work_dir, '20260101_000000', 'vis_data'))
    with open(osp.join(work_dir, '20260101_000000', 'vis_data', 'scalars.json'), 'w') as f:
        for i, loss in enumerate(losses):
            step = every * (i + 1)
            f.write(json.dumps(dict(lr=lr, loss=loss, iter=step, epoch=1, step=step)) + '\n')
            if kappa is not None and i % 2 == 1:
                f.write(json.dumps({**{key: kappa * (1 + i) / (j + 1) for j, key in enumerate(KAPPA_KEYS)},
                                    'step': step}) + '\n')
        for epoch, value in (validations or {}).items():
            f.write(json.dumps({'coco/bbox_mAP': value, 'coco/segm_mAP': value / 2, 'data_time': 0.1,
                                'time': 0.5, 'step': epoch}) + '\n')
    open(osp.join(work_dir, 'epoch_1.pth'), 'w').close()
    if bbox is None:
        return
    os.makedirs(osp.join(work_dir, 'test', '20260101_000100'))
    with open(osp.join(work_dir, 'test', '20260101_000100', '20260101_000100.json'), 'w') as f:
        json.dump({'coco/bbox_mAP': bbox, 'coco/segm_mAP': segm, 'coco/bbox_mAP_50': 2 * bbox, 'time': 1.0}, f)


def record_fingerprints(suite_path, out_dir, cfg_options=()):
    """Write into each written cell the fingerprint the runner records when it starts a cell of this suite."""
    suite = load_suite(str(suite_path), REPO_ROOT)
    phases = phase_of(suite)
    cells = []
    for phase in range(max(phases.values()) + 1):
        for stage in STAGES:
            new, _ = cells_of_stage(suite, phase, stage, phases, cells, str(out_dir), list(cfg_options))
            for cell in new:
                if osp.isdir(cell.work_dir):
                    write_fingerprint(cell, fingerprint(cell, REPO_ROOT))
                cell.results = cell_results(cell, suite.escape)
            cells += new


def run_runner(*args):
    """``python tools/suites/run_suite.py ARGS`` run in this process (:func:`helpers.repo.run_main`), for this
    checkout as the tool runs it; the cells' training and test commands still run as processes of their own."""
    return run_main(functools.partial(run_suite.main, root=REPO_ROOT), SCRIPT, *args)
