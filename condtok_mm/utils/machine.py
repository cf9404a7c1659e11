"""What a measurement ran on, and how long a call takes: for tools/benchmark/ and tools/analysis/."""
import importlib.metadata
import os
import os.path as osp
import platform
import time
from typing import Any, Callable, Iterable, Optional, Tuple

import torch


def cpu_model() -> str:
    """The CPU's model name ('Intel(R) Xeon(R) ...'), or the architecture where /proc/cpuinfo is missing."""
    if osp.exists('/proc/cpuinfo'):
        with open('/proc/cpuinfo') as f:
            names = [line.split(':', 1)[1].strip() for line in f if line.startswith('model name')]
        if names:
            return names[0]
    return platform.processor() or platform.machine()


def cpu_kind() -> str:
    """The CPU's model name and the vector instructions torch's CPU kernels use on it ('AMD EPYC (AVX512)'): two
    machines of one model name can differ there, and then round float32 differently."""
    return f'{cpu_model()} ({torch.backends.cpu.get_cpu_capability()})'


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity), which a container may set below os.cpu_count()."""
    return len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count()


def describe_machine(device: str = 'cpu', packages: Iterable[str] = ()) -> dict:
    """CPU, cores, torch threads, GPU (for a CUDA ``device``), load average now, versions of Python, torch
    and ``packages``."""
    gpu: Optional[str] = torch.cuda.get_device_name(device) if str(device).startswith('cuda') else None
    return dict(
        host=platform.node(), platform=platform.platform(), cpu=cpu_model(), cpu_count=os.cpu_count(),
        usable_cpus=usable_cpus(), torch_threads=torch.get_num_threads(), device=str(device), gpu=gpu,
        load_average=[round(v, 2) for v in os.getloadavg()] if hasattr(os, 'getloadavg') else None,
        python=platform.python_version(), torch=torch.__version__,
        **{package: importlib.metadata.version(package) for package in packages})


def machine_summary(machine: dict) -> str:
    """One line of :func:`describe_machine`'s dict, for tables and plot titles."""
    return (f'{machine["cpu"]}, {machine["usable_cpus"]} of {machine["cpu_count"]} CPUs ({machine["torch_threads"]} '
            f'torch threads), {machine["gpu"] or "no GPU"}, torch {machine["torch"]}')


def timed(fn: Callable[[], Any], device: str = 'cpu') -> Tuple[float, Any]:
    """(seconds, fn()): CUDA events around the call on a CUDA ``device`` (the GPU time of the work it
    queues, after what was queued before has finished), the wall clock otherwise."""
    if str(device).startswith('cuda'):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(device)
        start.record()
        result = fn()
        end.record()
        torch.cuda.synchronize(device)
        return start.elapsed_time(end) / 1000, result
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result
