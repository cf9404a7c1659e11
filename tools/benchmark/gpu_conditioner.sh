#!/usr/bin/env bash
# The conditioner's checks that need a CUDA device and nothing but torch (and timm for the backbone step), for a GPU
# machine without the OpenMMLab stack (tools/gpu_check.sh needs `make install`'s environment): in order,
#   1. tools/benchmark/conditioner_cost.py --device cuda --profile (eigh and Newton-Schulz eager, compiled and from a CUDA
#      graph, beside the float64 floor and the SVD forms; Swin-T and ViTDet-B token grids, B = 2 and 8);
#   2. the tests of tests/conditioning/test_conditioning_cuda.py (no host sync, CUDA-graph capture, torch.compile,
#      fp16/bf16 autocast, CPU parity), without tests/conftest.py (it needs the OpenMMLab stack);
#   3. tools/benchmark/backbone_share.py (the conditioner's share of the Swin-T and ViTDet-B backbone steps).
# Everything goes to OUT_DIR/gpu_check.json (device, torch, CUDA, commit, each part's rows, the tests' outcomes).
#   tools/benchmark/gpu_conditioner.sh [OUT_DIR] [BUDGET_S]
# BUDGET_S (default 300): seconds after which conditioner_cost.py measures eager calls only. PYTHON selects the
# interpreter; CONDTOK_COMMIT names the commit where the checkout has no git history. Without CUDA it says so and
# exits 0. Every part imports this checkout's condtok_mm (PYTHONPATH), installed or not; where mmengine is not
# installed, importing it registers nothing and condtok_mm.conditioning runs on its own (condtok_mm/__init__.py).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
export PYTHONPATH="$PWD:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}"  # tests/: the helpers the tests import
PYTHON=${PYTHON:-python3}
OUT_DIR=${1:-work_dirs/gpu_conditioner}
BUDGET_S=${2:-300}
export PYTHONUNBUFFERED=1

if [ "$("$PYTHON" -c 'import torch; print(int(torch.cuda.is_available()))')" != 1 ]; then
    echo "gpu_conditioner skipped: no CUDA device here (torch.cuda.is_available() is False)"
    exit 0
fi
mkdir -p "$OUT_DIR"
status=0
"$PYTHON" tools/benchmark/conditioner_cost.py --device cuda --profile --budget-s "$BUDGET_S" \
    --out-dir "$OUT_DIR/conditioner_cost" || status=1
"$PYTHON" -m pytest --noconftest -p no:cacheprovider tests/conditioning/test_conditioning_cuda.py \
    --junitxml="$OUT_DIR/gpu_tests.xml" || status=1
"$PYTHON" tools/benchmark/backbone_share.py --device cuda --out-dir "$OUT_DIR/backbone_share" || status=1
"$PYTHON" - "$OUT_DIR" <<'PY' || status=1
import json
import os.path as osp
import sys
import xml.etree.ElementTree as ET

out_dir = sys.argv[1]
summary = {}
cost = osp.join(out_dir, 'conditioner_cost', 'conditioner_cost.json')
if osp.exists(cost):
    summary['conditioner_cost'] = json.load(open(cost))
    summary.update(commit=summary['conditioner_cost']['commit'], machine=summary['conditioner_cost']['machine'])
tests_xml = osp.join(out_dir, 'gpu_tests.xml')
if osp.exists(tests_xml):
    summary['tests'] = [dict(test=f'{case.get("classname")}::{case.get("name")}',
                             outcome=next((child.tag for child in case if child.tag in ('failure', 'error', 'skipped')),
                                          'passed'),
                             message=next((child.get('message', '')[:500] for child in case
                                           if child.tag in ('failure', 'error', 'skipped')), None),
                             seconds=float(case.get('time', 0)))
                        for case in ET.parse(tests_xml).iter('testcase')]
share = osp.join(out_dir, 'backbone_share', 'backbone_share.json')
if osp.exists(share):
    summary['backbone_share'] = json.load(open(share))
with open(osp.join(out_dir, 'gpu_check.json'), 'w') as f:
    json.dump(summary, f, indent=1)
outcomes = [t['outcome'] for t in summary.get('tests', [])]
print(f'gpu_conditioner: {outcomes.count("passed")} of {len(outcomes)} tests passed; '
      f'numbers in {osp.join(out_dir, "gpu_check.json")}')
PY
exit $status
