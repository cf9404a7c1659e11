"""Suite cells written as a suite run leaves them, for the tests of the suite runner's gathering
(tools/benchmark/run_suite.py --gather-only) without training anything, and the runner's command line run in the
test's own process."""
import contextlib
import importlib.util
import io
import json
import os
import os.path as osp
import subprocess
import sys

from condtok_mm.benchmark.fingerprint import fingerprint, write_fingerprint
from condtok_mm.benchmark.plan import STAGES, cells_of_stage
from condtok_mm.benchmark.results import cell_results
from condtok_mm.benchmark.schema import load_suite, phase_of
from conftest import REPO_ROOT

SCRIPT = osp.join(REPO_ROOT, 'tools', 'benchmark', 'run_suite.py')
KAPPA_KEYS = ('kappa/tokens_out_mean/stage0', 'kappa/attn_input_mean/stage0')


def write_cell(out_dir, variant, lr, seed, bbox, segm, losses, kappa=None, every=10):
    """A finished cell as mmengine writes it: training scalars.json (a loss every ``every`` iterations, kappa
    records with their iteration as 'step') and the test epoch's JSON; bbox None leaves the cell untested."""
    work_dir = osp.join(out_dir, variant, f'lr{lr:g}', f'seed{seed}')
    os.makedirs(osp.join(work_dir, '20260101_000000', 'vis_data'))
    with open(osp.join(work_dir, '20260101_000000', 'vis_data', 'scalars.json'), 'w') as f:
        for i, loss in enumerate(losses):
            step = every * (i + 1)
            f.write(json.dumps(dict(lr=lr, loss=loss, iter=step, epoch=1, step=step)) + '\n')
            if kappa is not None and i % 2 == 1:
                f.write(json.dumps({**{key: kappa * (1 + i) / (j + 1) for j, key in enumerate(KAPPA_KEYS)},
                                    'step': step}) + '\n')
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
                    write_fingerprint(cell, fingerprint(cell))
                cell.results = cell_results(cell, suite.escape)
            cells += new


def load_runner():
    """tools/benchmark/run_suite.py (a script, not a module of the package) loaded as a module."""
    spec = importlib.util.spec_from_file_location('run_suite', SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


run_suite = load_runner()


def run_runner(*args):
    """``python tools/benchmark/run_suite.py ARGS`` run in this process: its exit status, stdout and stderr as
    subprocess.run returns them, the exit handled as the interpreter does (``sys.exit(MESSAGE)`` prints MESSAGE
    to stderr and exits with 1; any other exception fails the test with its traceback). The runner's own
    process would spend ~10 s importing condtok_mm and mmdet.models, which this one has; the cells' training
    and test commands still run as processes of their own."""
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            run_suite.main(list(args))
            returncode = 0
        except SystemExit as exit:
            if exit.code is None or isinstance(exit.code, int):
                returncode = exit.code or 0
            else:
                print(exit.code, file=sys.stderr)
                returncode = 1
    return subprocess.CompletedProcess([sys.executable, SCRIPT, *args], returncode, stdout.getvalue(),
                                       stderr.getvalue())
