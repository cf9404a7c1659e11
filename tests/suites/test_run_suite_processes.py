"""tools/suites/run_suite.py end to end in the runner's own process (SIGINT to it stops the training it runs, and
--resume continues the cell from its last checkpoint) and through SLURM (the stand-in srun of tests/fake_slurm); the
cells of a runner for another checkout run that checkout's code and record its commit; tests/suites/test_run_suite.py
has the suite files, the commands, the statistics and the other end-to-end runs."""
import argparse
import functools
import json
import os
import os.path as osp
import re
import signal
import subprocess
import sys
import time

import pytest

from condtok_mm.suites import launch, run_suite
from condtok_mm.suites.plan import Cell
from helpers.processes import alive, free_port, process_state, process_tree
from helpers.repo import REPO_ROOT, run_main
from helpers.suite_runs import BASELINE, FAKE_SLURM, SCRIPT, run_runner, suite_options, write_suite


def pending_signals(pid):
    """The signals sent to process ``pid`` that it has not handled yet (the ShdPnd mask of /proc/PID/status)."""
    with open(f'/proc/{pid}/status') as f:
        mask, = [int(line.split()[1], 16) for line in f if line.startswith('ShdPnd:')]
    return {number for number in range(1, 65) if mask >> (number - 1) & 1}


def process_status(pid):
    """The state and signal masks of process ``pid`` (what a failed wait for a signal shows)."""
    try:
        with open(f'/proc/{pid}/status') as f:
            return ' '.join(line.strip() for line in f if line.startswith(('State', 'SigPnd', 'ShdPnd', 'SigIgn',
                                                                              'SigBlk', 'SigCgt', 'Threads')))
    except OSError as error:
        return str(error)


# The runner's script run with SIGINT handled (KeyboardInterrupt), as a shell's foreground command has it: a command
# that a non-interactive shell starts in the background (`cmd &`, as CI scripts and job runners do) has SIGINT and
# SIGQUIT ignored (POSIX), the test process and every process it starts inherit that (SigIgn 0x1001006 in
# /proc/PID/status), and a runner that ignores SIGINT never stops its cell.
HANDLING_SIGINT = ('import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); '
                   "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')")


# The cell is paused (SIGSTOP) from its first checkpoint until the runner's SIGINT has reached it, so that it cannot
# finish first however loaded the machine is; the epochs after the first are the margin for the test's poll.
EPOCHS_TO_INTERRUPT = 4


@pytest.mark.slow
def test_sigint_to_the_runner_stops_its_cell_and_resume_continues_from_the_last_checkpoint(small_shapes, tmp_path):
    """SIGINT to the runner's own process (not its group, as Ctrl-C would send) stops the training it runs
    instead of waiting for the cell to finish; the cell resumes from its last checkpoint."""
    out_dir = tmp_path / 'out'
    path = write_suite(tmp_path / 's.py', dict(baseline=dict(config=BASELINE)), seeds=[0], lrs=[1e-3],
                       cfg_options=suite_options(small_shapes, EPOCHS_TO_INTERRUPT))
    process = subprocess.Popen([sys.executable, '-c', HANDLING_SIGINT, SCRIPT, path, '--out-dir', str(out_dir)],
                               cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    work_dir = out_dir / 'baseline' / 'lr0.001' / 'seed0'
    children = []
    try:
        deadline = time.monotonic() + 300
        while not (work_dir / 'last_checkpoint').exists():  # written once epoch_1.pth is complete
            assert process.poll() is None and time.monotonic() < deadline, 'the cell ended before its first checkpoint'
            time.sleep(0.2)
        children = process_tree(process.pid)[1:]
        assert children, 'the runner has no training process'
        for pid in children:
            os.kill(pid, signal.SIGSTOP)
        # Stopped, not only sent SIGSTOP: a SIGINT that reaches a child whose SIGSTOP is still pending (a loaded
        # machine has not run it since) is taken first, the lower signal number being dequeued first, and the
        # child then stops with it handled, never pending.
        deadline = time.monotonic() + 60
        while not all(process_state(pid) == 'T' for pid in children):
            assert time.monotonic() < deadline, 'the training did not stop: ' + \
                '; '.join(f'{pid}: {process_status(pid)}' for pid in children)
            time.sleep(0.1)
        assert not (work_dir / f'epoch_{EPOCHS_TO_INTERRUPT}.pth').exists(), 'the cell finished before the signal'
        process.send_signal(signal.SIGINT)
        deadline = time.monotonic() + 60
        while not all(alive(pid) and signal.SIGINT in pending_signals(pid) for pid in children):  # SIGINT first
            assert time.monotonic() < deadline, 'the runner did not pass the SIGINT on to its training: ' + \
                '; '.join(f'{pid}: {process_status(pid)}' for pid in [process.pid, *children])
            time.sleep(0.1)
        for pid in children:
            os.kill(pid, signal.SIGCONT)
        # bounded: the runner gives each child 10 s per signal; a loaded machine (the other test workers) needs the margin
        _, stderr = process.communicate(timeout=240)
    finally:
        if process.poll() is None:
            for pid in children:
                if alive(pid):
                    os.kill(pid, signal.SIGKILL)
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert process.returncode == 130, stderr[-3000:]
    assert 'interrupted: the running cells were stopped; the same command with --resume continues them' in stderr
    assert not [pid for pid in children if alive(pid)], 'a child of the runner outlived it'
    assert not (work_dir / f'epoch_{EPOCHS_TO_INTERRUPT}.pth').exists() and not (work_dir / 'test').exists()  # stopped
    last = int(re.search(r'epoch_(\d+)\.pth', (work_dir / 'last_checkpoint').read_text()).group(1))
    result = run_runner(path, '--out-dir', str(out_dir), '--resume')
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    resumed = (work_dir / 'train.log').read_text().split('$ ')[-1]
    assert '--resume' in resumed.splitlines()[0] and 'resumed' in resumed.lower()
    # mmengine pads the epoch to the width of max_epochs ('Epoch(train)  [2][1/2]' with 12)
    assert re.search(rf'Epoch\(train\) +\[{last + 1}\]', resumed)
    assert not re.search(rf'Epoch\(train\) +\[{last}\]', resumed)
    assert (work_dir / f'epoch_{EPOCHS_TO_INTERRUPT}.pth').exists()
    summary = json.loads((out_dir / 'suite.json').read_text())
    assert [c['status'] for c in summary['cells_detail']] == ['ran']
    # its curves are those of the same cell run without an interruption, from iteration 1 (exact resume)
    uninterrupted = tmp_path / 'uninterrupted'
    assert run_runner(path, '--out-dir', str(uninterrupted)).returncode == 0
    reference = json.loads((uninterrupted / 'suite.json').read_text())['cells_detail'][0]['results']
    resumed = summary['cells_detail'][0]['results']
    assert len(resumed['scalars']) == 2  # the interrupted run's scalars.json and the resumed one's
    assert resumed['loss']['iter'] == reference['loss']['iter'] == list(range(1, len(reference['loss']['iter']) + 1))
    assert resumed['loss']['value'] == pytest.approx(reference['loss']['value'], rel=1e-6)
    for key, curve in reference['kappa'].items():
        assert resumed['kappa'][key]['iter'] == curve['iter']
        assert resumed['kappa'][key]['value'] == pytest.approx(curve['value'], rel=1e-6)


@pytest.mark.slow
def test_a_cell_through_slurm_train_and_test_under_the_stand_in_srun(small_shapes, tmp_path, monkeypatch):
    out_dir = tmp_path / 'out'
    path = write_suite(tmp_path / 's.py', dict(baseline=dict(config=BASELINE)), seeds=[0], lrs=[1e-3],
                       cfg_options={**suite_options(small_shapes, 1), 'env_cfg.dist_cfg.backend': 'gloo'})
    for key, value in dict(PATH=f'{FAKE_SLURM}:{os.environ["PATH"]}', FAKE_SRUN_ARGS=str(tmp_path / 'srun.json'),
                           GRES='', CPUS_PER_TASK='1', MASTER_PORT=str(free_port()), CUDA_VISIBLE_DEVICES='').items():
        monkeypatch.setenv(key, value)  # the environment of the runner's commands
    result = run_runner(path, '--out-dir', str(out_dir), '--launcher', 'slurm', '--partition', 'cpu')
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    work_dir = out_dir / 'baseline' / 'lr0.001' / 'seed0'
    assert 'Distributed launcher: slurm' in (work_dir / 'train.log').read_text()
    srun = json.loads((tmp_path / 'srun.json').read_text())  # the last srun: the test
    assert srun[:2] == ['-p', 'cpu'] and '--job-name=baseline-lr0.001-seed0' in srun and '--ntasks=1' in srun
    summary = json.loads((out_dir / 'suite.json').read_text())
    assert summary['cells_detail'][0]['status'] == 'ran' and summary['launcher'] == 'slurm'


# tools/train.py and tools/test.py of a second checkout, standing in for the real ones: each writes where the
# condtok_mm it imported lives, the training its final checkpoint, the test a COCO metric where tools/test.py logs it.
STAND_IN_TOOL = """import json, os, sys
import condtok_mm
work_dir = sys.argv[sys.argv.index('--work-dir') + 1]
os.makedirs(os.path.join(work_dir, '20260101_000000'), exist_ok=True)
with open(os.path.join(work_dir, 'imported.txt'), 'w') as f:
    f.write(condtok_mm.__file__)
if sys.argv[0].endswith('train.py'):
    open(os.path.join(work_dir, 'epoch_1.pth'), 'w').close()
else:
    with open(os.path.join(work_dir, '20260101_000000', '20260101_000000.json'), 'w') as f:
        json.dump({'coco/bbox_mAP': 0.5}, f)
"""


def second_checkout(root):
    """A git checkout at ``root`` (a pathlib.Path) with a condtok_mm package of its own and the stand-in tools; its
    commit as the runner records it."""
    (root / 'condtok_mm').mkdir(parents=True)
    (root / 'condtok_mm' / '__init__.py').write_text('')
    (root / 'tools').mkdir()
    for name in ('train.py', 'test.py'):
        (root / 'tools' / name).write_text(STAND_IN_TOOL)

    def git(*args):
        return subprocess.run(['git', '-C', str(root), '-c', 'user.name=t', '-c', 'user.email=t@t', *args],
                              capture_output=True, text=True, check=True).stdout.strip()

    git('init', '-q')
    git('add', '.')
    git('commit', '-qm', 'frozen')
    return git('rev-parse', '--short=12', 'HEAD')


def test_a_cell_runs_the_code_of_the_checkout_its_runner_runs_from_and_records_its_commit(tmp_path):
    """The tools rely on the installed condtok_mm, which is this checkout's (PYTHONPATH here; an editable install
    elsewhere): a runner for a second checkout gives its cells that checkout's package, so that they run the code
    of the commit their records name."""
    root = tmp_path / 'frozen'
    commit = second_checkout(root)
    work_dir = tmp_path / 'out' / 'cell'
    cell = Cell('baseline', 1e-3, 0, str(work_dir), 'c.py', str(root / 'c.py'),
                checkpoint=str(work_dir / 'epoch_1.pth'), fingerprint={})
    args = argparse.Namespace(launcher='none', jobs=1, nproc=1, partition=None)
    cell = launch.run_cell(cell, args, 0, str(root), launch.Children())
    assert cell.status == 'ran', (work_dir / 'train.log').read_text() + (work_dir / 'test.log').read_text()
    package = str(root / 'condtok_mm' / '__init__.py')
    assert (work_dir / 'imported.txt').read_text() == package  # the training
    assert (work_dir / 'test' / 'imported.txt').read_text() == package  # the test
    assert json.loads((work_dir / 'suite_cell.json').read_text())['commit'] == commit


def test_a_runner_for_another_checkout_stops_naming_the_fix_where_it_imports_this_ones_package(tmp_path):
    root = tmp_path / 'frozen'
    second_checkout(root)
    suite = write_suite(tmp_path / 's.py', dict(baseline=dict(config=BASELINE)), seeds=[0], lrs=[1e-3])
    result = run_main(functools.partial(run_suite.main, root=str(root)), osp.join(root, 'tools', 'suites',
                                                                                  'run_suite.py'), suite, '--dry-run')
    assert result.returncode == 1 and result.stdout == ''
    assert f'imports the condtok_mm of {osp.realpath(REPO_ROOT)}, not that of the checkout it runs from ({root})' \
        in result.stderr and f'run it as PYTHONPATH={root} python' in result.stderr
