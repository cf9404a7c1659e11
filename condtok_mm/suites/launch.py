"""The train and test commands of a cell under each launcher, and running the pending cells of a phase.

Launchers (the distributed engine is mmdet's: torchrun or SLURM; the runner only starts the commands):
    none     tools/train.py, tools/test.py; ``jobs`` cells at a time, the usable CPUs shared out between them
    pytorch  tools/dist_train.sh CONFIG NPROC, tools/dist_test.sh (torchrun), ``nproc`` processes per cell,
             ``jobs`` cells at a time on distinct ports (PORT=29500 + slot)
    slurm    tools/slurm_train.sh PARTITION JOB CONFIG WORK_DIR, tools/slurm_test.sh (srun), GPUS=nproc per
             cell, ``jobs`` cells queued at a time

Every command imports the condtok_mm of the checkout it runs from (:func:`checkout_environment`), not one
installed from elsewhere: a study run from a second checkout (a worktree kept at a study's commit) runs that
commit's code in every cell, the commit its record names.

``args`` below is the runner's parsed command line: ``launcher``, ``jobs``, ``nproc``, ``partition``.
"""
import os
import os.path as osp
import shlex
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed

from tqdm import tqdm

from condtok_mm.utils import usable_cpus
from condtok_mm.utils.machine import cpu_kind
from condtok_mm.utils.package_files import package_root
from .fingerprint import cell_record, file_digest, source_commit, write_fingerprint
from .plan import lr_name
from .results import UnreadableCellFile, cell_state, evaluation, log_tail

LAUNCHERS = ('none', 'pytorch', 'slurm')


def tool(root, name):
    return osp.join(root, 'tools', name)


def checkout_environment(root):
    """The environment under which a command imports the condtok_mm of ``root``: PYTHONPATH with ``root`` first
    where ``root`` holds the package (a checkout; the tools rely on the installed package, which may be another
    checkout's editable install), before what PYTHONPATH already holds; nothing where it does not (the installed
    package's condtok_mm/.mim)."""
    if not osp.isfile(osp.join(root, 'condtok_mm', '__init__.py')):
        return {}
    return dict(PYTHONPATH=os.pathsep.join([root, *filter(None, [os.environ.get('PYTHONPATH')])]))


def foreign_package(root):
    """Why a runner for ``root`` must not run with the condtok_mm imported now, or None where that is ``root``'s:
    its fingerprints and reports would be another checkout's code's while its cells run ``root``'s."""
    imported = package_root()
    if osp.realpath(root) == imported:
        return None
    script = osp.join(root, 'tools', 'suites', 'run_suite.py')
    return (f'this runner imports the condtok_mm of {imported}, not that of the checkout it runs from ({root}), '
            f'whose cells would run its own: run it as PYTHONPATH={root} python {script} ... (or pip install -e '
            f'{root})')


def commands(cell, args, slot, root):
    """(train command, test command, extra environment) of a cell under the chosen launcher."""
    config = cell.config_path
    test_dir = osp.join(cell.work_dir, 'test')
    options = ['--cfg-options', *cell.options]
    test_options = [*options, *cell.test_options]
    resume = ['--resume'] if cell.resume else []
    checkpoint = cell.checkpoint
    if args.launcher == 'none':
        threads = str(max(1, usable_cpus() // args.jobs))
        env = dict(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads)
        train = [sys.executable, tool(root, 'train.py'), config, '--work-dir', cell.work_dir, *resume, *options]
        test = [sys.executable, tool(root, 'test.py'), config, checkpoint, '--work-dir', test_dir, *test_options]
    elif args.launcher == 'pytorch':
        threads = str(max(1, usable_cpus() // (args.jobs * args.nproc)))
        env = dict(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads, PORT=str(29500 + slot),
                   PYTHON=sys.executable)
        train = ['bash', tool(root, 'dist_train.sh'), config, str(args.nproc), '--work-dir', cell.work_dir, *resume,
                 *options]
        test = ['bash', tool(root, 'dist_test.sh'), config, checkpoint, str(args.nproc), '--work-dir', test_dir,
                *test_options]
    else:
        job = f'{cell.variant}-{lr_name(cell.lr)}-seed{cell.seed}'
        env = dict(GPUS=str(args.nproc), GPUS_PER_NODE=str(min(args.nproc, 8)), PYTHON=sys.executable)
        train = ['bash', tool(root, 'slurm_train.sh'), args.partition, job, config, cell.work_dir, *resume, *options]
        test = ['bash', tool(root, 'slurm_test.sh'), args.partition, job, config, checkpoint, '--work-dir', test_dir,
                *test_options]
    return train, test, dict(env, **checkout_environment(root))


class Children:
    """The commands the runner has started, each in a process group of its own, so that an interrupted runner
    can stop them (their data loader workers and torchrun's or srun's processes with them) instead of waiting
    for them: a SIGINT sent to the runner alone reaches none of them.

    Args:
        grace_s (float): seconds a command has to exit after SIGINT, and again after SIGTERM, before SIGKILL.
    """

    def __init__(self, grace_s=10.0):
        self.grace_s = grace_s
        self.lock = threading.Lock()
        self.running = set()
        self.stopping = False

    def run(self, command, log, env, cwd):
        """The command's exit code; None, without starting it, once :meth:`stop` was called."""
        with self.lock:  # a command started while stop() signals the others would escape it
            if self.stopping:
                return None
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=cwd, env=env,
                                       start_new_session=True)
            self.running.add(process)
        try:
            return process.wait()
        finally:
            with self.lock:
                self.running.discard(process)

    def stop(self):
        """Start nothing more; SIGINT each running command's process group (mmengine's runner stops at
        KeyboardInterrupt), then SIGTERM and SIGKILL to those still there after ``grace_s`` each."""
        with self.lock:
            self.stopping = True
            processes = list(self.running)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
            for process in processes:
                if process.poll() is None:
                    try:
                        os.killpg(process.pid, sig)
                    except ProcessLookupError:  # exited between poll() and killpg()
                        pass
            deadline = time.monotonic() + self.grace_s
            while any(process.poll() is None for process in processes) and time.monotonic() < deadline:
                time.sleep(0.1)
            if all(process.poll() is not None for process in processes):
                break
        for process in processes:
            process.wait()


def run_logged(children, command, log_path, env, root):
    with open(log_path, 'a') as log:
        log.write('$ ' + shlex.join(command) + '\n\n')
        log.flush()
        return children.run(command, log, dict(os.environ, **env), root)


def cell_cpus(earlier, launcher):
    """The kinds of CPU a cell's commands ran on, '; '-joined across resumes (``earlier``: what its record says,
    None for a cell trained from the start): this machine's for local commands, unknown (None) under torchrun or
    SLURM, whose processes may run elsewhere."""
    now = cpu_kind() if launcher == 'none' else None
    kinds = (earlier.split('; ') if earlier else []) + ([now] if now else [])
    return '; '.join(dict.fromkeys(kinds)) or None


def run_cell(cell, args, slot, root, children):
    """Record the cell's fingerprint, train (or resume) and test it; returns the cell with its status and wall
    time ('interrupted' when :meth:`Children.stop` ended or skipped a command). The record keeps the seconds of
    every command that made the cell: a resumed cell adds to what its earlier runs took, one trained again from
    the start does not. It keeps the SHA-256 of the final checkpoint once a test of it has ended on its own,
    whatever its exit code: a test that failed on it is then known from one the runner stopped or never started
    (None), which is what lets a study's rule count a diverged cell the test could not score."""
    state = cell_state(cell)
    earlier = (cell_record(cell) or {}) if state in ('interrupted', 'trained') else {}  # read once, for both
    earlier_s = earlier.get('wall_s') or 0.0
    cpu = cell_cpus(earlier.get('cpu'), args.launcher)
    commit = source_commit(root)
    write_fingerprint(cell, cell.fingerprint, commit=commit, wall_s=earlier_s, cpu=cpu)
    start = time.perf_counter()
    cell.resume = state == 'interrupted'
    train, test, env = commands(cell, args, slot, root)
    cell.log = osp.join(cell.work_dir, 'train.log')
    returncode, test_ended = 0, False
    if state in ('new', 'interrupted'):
        returncode = run_logged(children, train, cell.log, env, root)
    if returncode == 0:
        cell.log = osp.join(cell.work_dir, 'test.log')
        returncode = run_logged(children, test, cell.log, env, root)
        test_ended = returncode is not None and not children.stopping  # a stopped test says nothing of it
    cell.returncode, cell.wall_s = returncode, earlier_s + time.perf_counter() - start
    digest = file_digest(cell.checkpoint, root) if test_ended else None
    write_fingerprint(cell, cell.fingerprint, commit=commit, wall_s=cell.wall_s, cpu=cpu,
                      checkpoint_sha256=digest and digest.split(':', 1)[1])
    if children.stopping:
        cell.status = 'interrupted'
    else:
        try:
            tested = evaluation(cell) is not None
        except UnreadableCellFile:  # gathered as unreadable, which names the file
            tested = True
        cell.status = 'ran' if returncode == 0 and tested else 'failed'
    return cell


def run_pending(pending, args, root, desc):
    """Run the cells, ``args.jobs`` at a time, each on a slot of its own (a port under torchrun); a failed
    cell's log tail is printed and the others go on. On KeyboardInterrupt (SIGINT, or SIGTERM where the
    runner turns it into one) the running commands are stopped, the interrupt raised again once they are."""
    children = Children()
    pool = ThreadPoolExecutor(max_workers=args.jobs)
    try:
        with tqdm(total=len(pending), desc=desc, unit='cell') as progress:
            free_slots = list(range(args.jobs))
            futures = {}
            queue = list(pending)

            def submit():
                while queue and free_slots:
                    cell = queue.pop(0)
                    slot = free_slots.pop(0)
                    futures[pool.submit(run_cell, cell, args, slot, root, children)] = slot

            submit()
            while futures:
                future = next(as_completed(futures))
                free_slots.append(futures.pop(future))
                cell = future.result()
                if cell.status == 'failed':
                    progress.write(f'cell {cell.variant} lr {cell.lr:g} seed {cell.seed} failed (exit '
                                   f'code {cell.returncode}); log: {cell.log}\n--- last lines ---\n'
                                   f'{log_tail(cell.log)}')
                progress.update()
                progress.set_postfix(failed=sum(c.status == 'failed' for c in pending))
                submit()
    except BaseException:
        children.stop()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
