#!/usr/bin/env bash
# The checks that need a CUDA device, in one run of under 10 minutes on one GPU: mmcv's compiled CUDA ops
# (tools/mmcv_build.py check: nms and RoIAlign on the GPU against the CPU), the tests marked `gpu`
# (AMP fp16/bf16 training with the conditioner, per-window conditioning on CUDA, the hook's NCCL reduction)
# and tools/benchmark/overhead.py --device cuda --methods spectral graying (Swin-T and ViTDet-B at full size, the
# conditioned twin beside spectral conditioning and Token Graying). Every number goes to
# OUT_DIR/gpu_check.json (mmcv's build and ops check, the tests' outcomes and times, overhead.json's results and
# machine).
#   tools/gpu_check.sh [OUT_DIR]        default work_dirs/gpu_check; PYTHON selects the interpreter
# Without a CUDA device it says so in one line and exits 0.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
PYTHON=${PYTHON:-python}
OUT_DIR=${1:-work_dirs/gpu_check}

if ! cuda=$("$PYTHON" -c 'import torch; print(int(torch.cuda.is_available()))'); then
    echo "gpu-check: $PYTHON cannot import torch; run make install, or set PYTHON" >&2
    exit 1
fi
if [ "$cuda" != 1 ]; then
    echo "gpu-check skipped: no CUDA device here (torch.cuda.is_available() is False)"
    exit 0
fi
mkdir -p "$OUT_DIR"
status=0
"$PYTHON" tools/mmcv_build.py check cuda 2>&1 | tee "$OUT_DIR/mmcv_ops.txt"
[ "${PIPESTATUS[0]}" = 0 ] || status=1
"$PYTHON" -m pytest -m gpu tests -p no:cacheprovider --junitxml="$OUT_DIR/gpu_tests.xml" || status=1
"$PYTHON" tools/benchmark/overhead.py --device cuda --repeats 5 --methods spectral graying --out-dir "$OUT_DIR/overhead" || status=1
"$PYTHON" - "$OUT_DIR" <<'PY' || status=1
import json
import os.path as osp
import sys
import xml.etree.ElementTree as ET

out_dir = sys.argv[1]
summary = {}
mmcv_build = osp.join(sys.prefix, '.condtok_mm-mmcv-build.txt')  # written by tools/install.sh
summary['mmcv'] = dict(build=open(mmcv_build).read().strip() if osp.exists(mmcv_build) else None,
                       ops_check=open(osp.join(out_dir, 'mmcv_ops.txt')).read().strip())
tests_xml = osp.join(out_dir, 'gpu_tests.xml')
if osp.exists(tests_xml):
    tests = []
    for case in ET.parse(tests_xml).iter('testcase'):
        outcome = next((child.tag for child in case if child.tag in ('failure', 'error', 'skipped')), 'passed')
        tests.append(dict(test=f'{case.get("classname")}::{case.get("name")}', outcome=outcome,
                          seconds=float(case.get('time', 0))))
    summary['tests'] = tests
overhead_json = osp.join(out_dir, 'overhead', 'overhead.json')
if osp.exists(overhead_json):
    summary['overhead'] = json.load(open(overhead_json))
with open(osp.join(out_dir, 'gpu_check.json'), 'w') as f:
    json.dump(summary, f, indent=1)
outcomes = [t['outcome'] for t in summary.get('tests', [])]
print(f'gpu-check: {outcomes.count("passed")} of {len(outcomes)} gpu tests passed; '
      f'numbers in {osp.join(out_dir, "gpu_check.json")}')
PY
exit $status
