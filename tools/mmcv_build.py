"""Which mmcv build `make install` compiles on this machine, and whether the installed one works.

    python tools/mmcv_build.py choose          prints FORCE_CUDA=, TORCH_CUDA_ARCH_LIST=, CUDA_HOME= and
                                               MMCV_BUILD_TAG= lines for tools/install.sh
    python tools/mmcv_build.py check TAG       runs mmcv's nms and RoIAlign on the CPU and, for any TAG but
                                               'cpu' (e.g. cu13.0-sm90, or cuda), on the GPU too

The choice (``choose_build``, a pure function of the facts ``machine_facts`` gathers, so that it is tested
without a GPU):

- CUDA ops when torch is a CUDA build and sees a device, or when FORCE_CUDA=1 (a build host without a GPU);
  CPU ops otherwise, and always with FORCE_CUDA=0. mmcv 2.1.0's setup.py (L255) compiles CUDA ops whenever
  ``torch.cuda.is_available()``, whatever FORCE_CUDA says, so install.sh hides the GPUs from a CPU build.
- A CUDA build needs the toolkit torch's cpp_extension will use (its CUDA_HOME: $CUDA_HOME, else the parent of
  the nvcc on PATH, else /usr/local/cuda) with nvcc and the CUDA headers, and nvcc's major version equal to
  torch.version.cuda's (cpp_extension refuses a major mismatch only once the compile has started). Anything
  missing stops the install with a message naming the fix.
- It compiles for the visible GPUs' architectures only (TORCH_CUDA_ARCH_LIST from
  ``torch.cuda.get_device_capability``; a TORCH_CUDA_ARCH_LIST already set is kept): cpp_extension would
  otherwise compile every .cu file once per architecture torch supports.
- The tag keys the wheel cache: 'cpu', or e.g. 'cu13.0-sm90' (nvcc release and architectures).
"""
import dataclasses
import os
import os.path as osp
import re
import subprocess
import sys
from typing import Optional, Sequence, Tuple

ARCH = re.compile(r'\d+\.\d+a?(\+PTX)?')


class BuildError(Exception):
    """The machine cannot build the mmcv it asks for; the message names the fix."""


@dataclasses.dataclass(frozen=True)
class Machine:
    """What decides the build.

    Args:
        torch_cuda (str, optional): ``torch.version.cuda``, e.g. '13.0'; None for a CPU-only torch.
        capabilities (sequence of (int, int)): ``torch.cuda.get_device_capability`` of every visible GPU.
        device_names (sequence of str): their names, for messages.
        cuda_home (str, optional): the toolkit cpp_extension would use, None when it finds none.
        nvcc_release (str, optional): 'X.Y' from ``CUDA_HOME/bin/nvcc --version``; None without that nvcc.
        cuda_headers (bool): CUDA_HOME/include/cuda_runtime.h exists.
        force_cuda (str, optional): the FORCE_CUDA environment variable.
        arch_list (str, optional): the TORCH_CUDA_ARCH_LIST environment variable.
    """
    torch_cuda: Optional[str]
    capabilities: Sequence[Tuple[int, int]] = ()
    device_names: Sequence[str] = ()
    cuda_home: Optional[str] = None
    nvcc_release: Optional[str] = None
    cuda_headers: bool = False
    force_cuda: Optional[str] = None
    arch_list: Optional[str] = None


@dataclasses.dataclass(frozen=True)
class Build:
    force_cuda: str  # '1' or '0', passed to mmcv's setup.py
    arch_list: str  # TORCH_CUDA_ARCH_LIST, '' for a CPU build
    cuda_home: str  # '' for a CPU build
    tag: str  # the wheel cache key: 'cpu' or 'cu<nvcc release>-sm<arch>[-sm<arch>...]'
    summary: str  # one line for the install log


CPU_BUILD_HINT = ('run `FORCE_CUDA=0 make install` to build mmcv with CPU ops only (Mask R-CNN\'s RoIAlign and nms '
                  'then fail on GPU tensors)')


def choose_build(machine: Machine) -> Build:
    """The mmcv build for ``machine``; raises BuildError with the fix when its CUDA build cannot work."""
    force = machine.force_cuda or None
    if force not in (None, '0', '1'):
        raise BuildError(f'FORCE_CUDA={machine.force_cuda!r}: set it to 1 (CUDA ops) or 0 (CPU ops), or unset it')
    if force == '0':
        return Build('0', '', '', 'cpu', 'CPU ops (FORCE_CUDA=0)')
    if machine.torch_cuda is None:
        if force == '1':
            raise BuildError('FORCE_CUDA=1 but this torch is a CPU-only build (torch.version.cuda is None): install '
                             'the CUDA torch of requirements/constraints.txt, or unset FORCE_CUDA')
        return Build('0', '', '', 'cpu', 'CPU ops (torch is a CPU-only build)')
    if not machine.capabilities and force != '1':
        return Build('0', '', '', 'cpu', 'CPU ops (torch sees no CUDA device; FORCE_CUDA=1 builds CUDA ops anyway)')
    gpus = ', '.join(machine.device_names) or 'no visible GPU (FORCE_CUDA=1)'
    toolkit = f'the CUDA {machine.torch_cuda} toolkit (this torch was built with CUDA {machine.torch_cuda})'
    if machine.nvcc_release is None:
        where = (f'{machine.cuda_home}/bin/nvcc does not exist' if machine.cuda_home else
                 'no nvcc on PATH, CUDA_HOME unset and no /usr/local/cuda')
        raise BuildError(f'torch sees {gpus} but mmcv\'s CUDA ops need nvcc: {where}. Install {toolkit} and put its '
                         f'bin/ on PATH or set CUDA_HOME to it; or {CPU_BUILD_HINT}')
    if not machine.cuda_headers:
        raise BuildError(f'CUDA_HOME={machine.cuda_home} has bin/nvcc but no include/cuda_runtime.h (a wrapper '
                         f'script or a partial toolkit?): set CUDA_HOME to the toolkit root, e.g. /usr/local/cuda, '
                         f'or {CPU_BUILD_HINT}')
    if machine.nvcc_release.split('.')[0] != machine.torch_cuda.split('.')[0]:
        raise BuildError(f'nvcc at {machine.cuda_home} is CUDA {machine.nvcc_release} but torch was built with CUDA '
                         f'{machine.torch_cuda} (cpp_extension refuses a major mismatch): install {toolkit} and set '
                         f'CUDA_HOME to it; or {CPU_BUILD_HINT}')
    if machine.arch_list:
        archs = machine.arch_list.replace(';', ' ').split()
        if not archs or not all(ARCH.fullmatch(a) for a in archs):
            raise BuildError(f'TORCH_CUDA_ARCH_LIST={machine.arch_list!r} is not a list of compute capabilities '
                             'such as "9.0" or "8.6;9.0+PTX"; unset it to build for the visible GPUs')
    elif machine.capabilities:
        archs = [f'{major}.{minor}' for major, minor in sorted(set(machine.capabilities))]
    else:
        raise BuildError('FORCE_CUDA=1 without a visible GPU: set TORCH_CUDA_ARCH_LIST to the target GPUs\' compute '
                         'capabilities, e.g. TORCH_CUDA_ARCH_LIST="9.0" for H100/H200, "8.6" for RTX 30xx')
    tag = f'cu{machine.nvcc_release}-' + '-'.join(
        'sm' + a.replace('.', '').replace('+PTX', 'ptx') for a in archs)
    return Build('1', ';'.join(archs), machine.cuda_home, tag,
                 f'CUDA ops for {";".join(archs)} ({gpus}) with nvcc {machine.nvcc_release} at {machine.cuda_home}')


def nvcc_release(cuda_home: Optional[str]) -> Optional[str]:
    """'X.Y' from ``cuda_home/bin/nvcc --version``; None when there is no such nvcc."""
    nvcc = osp.join(cuda_home, 'bin', 'nvcc') if cuda_home else None
    if nvcc is None or not os.access(nvcc, os.X_OK):
        return None
    output = subprocess.run([nvcc, '--version'], capture_output=True, text=True, timeout=60).stdout
    found = re.search(r'release (\d+\.\d+)', output)
    if found is None:
        raise BuildError(f'{nvcc} --version does not say its release ("release X.Y"): {output.strip()!r}')
    return found.group(1)


def machine_facts() -> Machine:
    """This machine's facts, from torch and the environment."""
    import logging

    import torch
    # cpp_extension warns "No CUDA runtime is found" on import where there is no GPU; the build says it anyway
    logging.getLogger('torch.utils.cpp_extension').setLevel(logging.ERROR)
    from torch.utils.cpp_extension import CUDA_HOME  # the toolkit mmcv's CUDAExtension will compile with

    count = torch.cuda.device_count() if torch.version.cuda else 0
    return Machine(
        torch_cuda=torch.version.cuda,
        capabilities=[torch.cuda.get_device_capability(i) for i in range(count)],
        device_names=[torch.cuda.get_device_name(i) for i in range(count)],
        cuda_home=CUDA_HOME, nvcc_release=nvcc_release(CUDA_HOME),
        cuda_headers=bool(CUDA_HOME) and osp.exists(osp.join(CUDA_HOME, 'include', 'cuda_runtime.h')),
        force_cuda=os.environ.get('FORCE_CUDA'), arch_list=os.environ.get('TORCH_CUDA_ARCH_LIST'))


def check_ops(tag: str) -> str:
    """Run mmcv's compiled nms and RoIAlign (the ops Mask R-CNN calls) against known values; for a CUDA tag,
    also on the GPU against the CPU. Returns what ran; raises AssertionError naming what is wrong."""
    import torch
    from mmcv.ops import RoIAlign, get_compiling_cuda_version, nms  # ImportError: mmcv._ext was not compiled

    boxes = torch.tensor([[0., 0., 10., 10.], [1., 1., 10., 10.], [20., 20., 30., 30.]])
    scores = torch.tensor([0.9, 0.8, 0.7])
    features = torch.arange(2 * 8 * 8, dtype=torch.float32).reshape(1, 2, 8, 8)
    rois = torch.tensor([[0., 1., 1., 5., 5.], [0., 0., 2., 7., 6.]])
    roi_align = RoIAlign((2, 2), spatial_scale=1.0, sampling_ratio=2, aligned=True)
    _, keep = nms(boxes, scores, iou_threshold=0.5)
    assert keep.tolist() == [0, 2], f'mmcv nms on the CPU kept {keep.tolist()}, expected [0, 2]'
    # RoIAlign of a linear ramp (row y, column x, channel c -> 8 y + x + 64 c) averages samples of a linear
    # function: the ramp at each bin centre, which aligned=True shifts by half a pixel
    pooled = roi_align(features, rois)
    for roi, (x0, y0, x1, y1) in enumerate(rois[:, 1:].tolist()):
        ys = y0 + (y1 - y0) * torch.tensor([0.25, 0.75]) - 0.5
        xs = x0 + (x1 - x0) * torch.tensor([0.25, 0.75]) - 0.5
        ramp = 8 * ys[:, None] + xs[None, :]
        expected = torch.stack([ramp, ramp + 64])
        assert torch.allclose(pooled[roi], expected, atol=1e-4), f'mmcv RoIAlign on the CPU: {pooled[roi]}'
    if tag == 'cpu':
        return 'nms and RoIAlign on the CPU'
    compiled = get_compiling_cuda_version()
    assert compiled != 'not available', (
        f'mmcv was compiled without CUDA ops but this machine\'s build is {tag}: remove the cached wheel and rerun '
        'make install')
    assert torch.cuda.is_available(), f'the mmcv build is {tag} but torch sees no CUDA device'
    _, keep_cuda = nms(boxes.cuda(), scores.cuda(), iou_threshold=0.5)
    assert keep_cuda.tolist() == [0, 2], f'mmcv nms on CUDA kept {keep_cuda.tolist()}, expected [0, 2]'
    pooled_cuda = roi_align(features.cuda(), rois.cuda()).cpu()
    assert torch.allclose(pooled_cuda, pooled, atol=1e-4), f'mmcv RoIAlign on CUDA {pooled_cuda} != CPU {pooled}'
    return f'nms and RoIAlign on the CPU and on {torch.cuda.get_device_name()} (mmcv compiled with CUDA {compiled})'


def main(argv: Sequence[str]) -> int:
    if len(argv) == 1 and argv[0] == 'choose':
        try:
            build = choose_build(machine_facts())
        except BuildError as error:
            print(f'[install] ERROR: {error}', file=sys.stderr)
            return 1
        print(f'[install] mmcv build: {build.summary}', file=sys.stderr)
        print(f'FORCE_CUDA={build.force_cuda}\nTORCH_CUDA_ARCH_LIST={build.arch_list}\n'
              f'CUDA_HOME={build.cuda_home}\nMMCV_BUILD_TAG={build.tag}')
        return 0
    if len(argv) == 2 and argv[0] == 'check':
        try:
            print(f'[install] mmcv ops work: {check_ops(argv[1])}')
        except (ImportError, AssertionError) as error:
            print(f'[install] ERROR: {type(error).__name__}: {error}', file=sys.stderr)
            return 1
        return 0
    print(__doc__.split('\n\n')[1], file=sys.stderr)
    return 2


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
