"""The train and test commands of a cell under each launcher, and running the pending cells of a phase.

Launchers (the distributed engine is mmdet's: torchrun or SLURM; the runner only starts the commands):
    none     tools/train.py, tools/test.py; ``jobs`` cells at a time, the usable CPUs shared out between them
    pytorch  tools/dist_train.sh CONFIG NPROC, tools/dist_test.sh (torchrun), ``nproc`` processes per cell,
             ``jobs`` cells at a time on distinct ports (PORT=29500 + slot)
    slurm    tools/slurm_train.sh PARTITION JOB CONFIG WORK_DIR, tools/slurm_test.sh (srun), GPUS=nproc per
             cell, ``jobs`` cells queued at a time

``args`` below is the runner's parsed command line: ``launcher``, ``jobs``, ``nproc``, ``partition``.
"""
import os
import os.path as osp
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed

from tqdm import tqdm

from condtok_mm.utils import usable_cpus
from .plan import lr_name
from .results import cell_state, evaluation, log_tail

LAUNCHERS = ('none', 'pytorch', 'slurm')


def tool(root, name):
    return osp.join(root, 'tools', name)


def commands(cell, args, slot, root):
    """(train command, test command, extra environment) of a cell under the chosen launcher."""
    config = cell.config_path
    test_dir = osp.join(cell.work_dir, 'test')
    options = ['--cfg-options', *cell.options]
    resume = ['--resume'] if cell.resume else []
    checkpoint = cell.checkpoint
    if args.launcher == 'none':
        threads = str(max(1, usable_cpus() // args.jobs))
        env = dict(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads)
        train = [sys.executable, tool(root, 'train.py'), config, '--work-dir', cell.work_dir, *resume, *options]
        test = [sys.executable, tool(root, 'test.py'), config, checkpoint, '--work-dir', test_dir, *options]
    elif args.launcher == 'pytorch':
        threads = str(max(1, usable_cpus() // (args.jobs * args.nproc)))
        env = dict(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads, PORT=str(29500 + slot),
                   PYTHON=sys.executable)
        train = ['bash', tool(root, 'dist_train.sh'), config, str(args.nproc), '--work-dir', cell.work_dir, *resume,
                 *options]
        test = ['bash', tool(root, 'dist_test.sh'), config, checkpoint, str(args.nproc), '--work-dir', test_dir,
                *options]
    else:
        job = f'{cell.variant}-{lr_name(cell.lr)}-seed{cell.seed}'
        env = dict(GPUS=str(args.nproc), GPUS_PER_NODE=str(min(args.nproc, 8)), PYTHON=sys.executable)
        train = ['bash', tool(root, 'slurm_train.sh'), args.partition, job, config, cell.work_dir, *resume, *options]
        test = ['bash', tool(root, 'slurm_test.sh'), args.partition, job, config, checkpoint, '--work-dir', test_dir,
                *options]
    return train, test, env


def run_logged(command, log_path, env, root):
    with open(log_path, 'a') as log:
        log.write('$ ' + shlex.join(command) + '\n\n')
        log.flush()
        return subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, cwd=root,
                              env=dict(os.environ, **env)).returncode


def run_cell(cell, args, slot, root):
    """Train (or resume) and test one cell; returns the cell with its status and wall time."""
    os.makedirs(cell.work_dir, exist_ok=True)
    start = time.perf_counter()
    state = cell_state(cell)
    cell.resume = state == 'interrupted'
    train, test, env = commands(cell, args, slot, root)
    cell.log = osp.join(cell.work_dir, 'train.log')
    returncode = 0
    if state in ('new', 'interrupted'):
        returncode = run_logged(train, cell.log, env, root)
    if returncode == 0:
        cell.log = osp.join(cell.work_dir, 'test.log')
        returncode = run_logged(test, cell.log, env, root)
    cell.returncode, cell.wall_s = returncode, time.perf_counter() - start
    cell.status = 'ran' if returncode == 0 and evaluation(cell) else 'failed'
    return cell


def run_pending(pending, args, root, desc):
    """Run the cells, ``args.jobs`` at a time, each on a slot of its own (a port under torchrun); a failed
    cell's log tail is printed and the others go on."""
    with tqdm(total=len(pending), desc=desc, unit='cell') as progress, \
            ThreadPoolExecutor(max_workers=args.jobs) as pool:
        free_slots = list(range(args.jobs))
        futures = {}
        queue = list(pending)

        def submit():
            while queue and free_slots:
                cell = queue.pop(0)
                slot = free_slots.pop(0)
                futures[pool.submit(run_cell, cell, args, slot, root)] = slot

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
