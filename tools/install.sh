#!/usr/bin/env bash
# Install the pinned OpenMMLab stack and condtok_mm into ./.venv (called by `make install`).
#
# Order matters and each step covers a known break of the pinned stack:
#   1. torch/torchvision and build tools first: mmcv's setup.py imports torch at build time, and
#      mmcv's setup.py plus mmengine's `mmdet::` config lookup import pkg_resources (setuptools<81).
#   2. mmcv 2.1.0 compiled from its source release with CPU ops (PyPI has no wheel for torch 2.14),
#      with `-std=c++17` patched to `-std=c++20` (torch 2.14's headers refuse C++17) and
#      --no-build-isolation (an isolated build cannot see torch and silently drops mmcv._ext).
#      The wheel is cached outside the repo so a reinstall skips the ~10-minute compile.
#   3. mmengine/mmdet/mmpretrain, evaluation and test requirements, then condtok_mm (editable).
# Every pip call installs the exact versions of requirements/constraints.txt (setup.py itself declares ranges).
# Idempotent: a stamp records the hash of every requirement file and of this script; when it
# matches and mmcv.ops loads, nothing is done.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
PYTHON=${PYTHON:-python3.11}
VENV=${VENV:-$ROOT/.venv}
CACHE=${CONDTOK_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/condtok_mm}
MMCV_VERSION=$(sed -n 's/^mmcv==//p' requirements/constraints.txt)  # the verified mmcv, compiled below
VPY="$VENV/bin/python"
STAMP="$VENV/.condtok_mm-install"

log() { printf '[install] %s\n' "$*"; }
die() { printf '[install] ERROR: %s\n' "$*" >&2; exit 1; }

check_mmcv_ops() {
    "$VPY" - <<'PY'
import torch
from mmcv.ops import nms, RoIAlign  # noqa: F401  (fails when mmcv._ext was not compiled)
boxes = torch.tensor([[0., 0., 10., 10.], [1., 1., 10., 10.], [20., 20., 30., 30.]])
_, keep = nms(boxes, torch.tensor([0.9, 0.8, 0.7]), iou_threshold=0.5)
assert keep.tolist() == [0, 2], keep
PY
}

stamp_value() {
    cat requirements/*.txt setup.py tools/install.sh | sha256sum | cut -d' ' -f1
}

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$(stamp_value)" ] && check_mmcv_ops 2>/dev/null; then
    log "already installed in $VENV (delete $STAMP to force a reinstall)"
    exit 0
fi

command -v "$PYTHON" >/dev/null || die "$PYTHON not found; set PYTHON=/path/to/python3.11"
"$PYTHON" -c 'import sys; assert sys.version_info[:2] == (3, 11), sys.version' \
    || die "condtok_mm's pinned stack is verified on Python 3.11; set PYTHON=/path/to/python3.11"

if [ ! -x "$VPY" ]; then
    log "creating $VENV"
    "$PYTHON" -m venv "$VENV"
fi
PIP=("$VPY" -m pip --disable-pip-version-check)
CONSTRAINTS=(-c requirements/constraints.txt)

log "step 1/3: torch, torchvision and build tools"
"${PIP[@]}" install -q "${CONSTRAINTS[@]}" -r requirements/build.txt

TORCH_VERSION=$("$VPY" -c 'import torch; print(torch.__version__.split("+")[0])')
PY_TAG=$("$VPY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
WHEEL_DIR="$CACHE/wheels/mmcv-$MMCV_VERSION-torch$TORCH_VERSION-$PY_TAG-cpu"

if "$VPY" -c "import mmcv, sys; sys.exit(mmcv.__version__ != '$MMCV_VERSION')" 2>/dev/null && check_mmcv_ops 2>/dev/null; then
    log "step 2/3: mmcv $MMCV_VERSION with compiled ops already installed"
else
    if ! ls "$WHEEL_DIR"/mmcv-*.whl >/dev/null 2>&1; then
        log "step 2/3: compiling mmcv $MMCV_VERSION (CPU ops) against torch $TORCH_VERSION; ~10 min on 2 cores"
        BUILD=$(mktemp -d)
        trap 'rm -rf "$BUILD"' EXIT
        "${PIP[@]}" download -q --no-deps --no-binary :all: "mmcv==$MMCV_VERSION" -d "$BUILD"
        tar -xzf "$BUILD"/mmcv-"$MMCV_VERSION".tar.gz -C "$BUILD"
        SRC="$BUILD/mmcv-$MMCV_VERSION"
        grep -q -- '-std=c++17' "$SRC/setup.py" || die "mmcv setup.py no longer has -std=c++17; re-check the C++20 patch"
        sed -i 's/-std=c++17/-std=c++20/g' "$SRC/setup.py"
        mkdir -p "$WHEEL_DIR.tmp"
        CFLAGS=-g0 MAX_JOBS=${MAX_JOBS:-$(nproc)} MMCV_WITH_OPS=1 FORCE_CUDA=${FORCE_CUDA:-0} \
            "${PIP[@]}" wheel -q --no-build-isolation --no-deps "$SRC" -w "$WHEEL_DIR.tmp"
        rm -rf "$WHEEL_DIR" && mv "$WHEEL_DIR.tmp" "$WHEEL_DIR"   # publish the cache entry whole
    else
        log "step 2/3: mmcv $MMCV_VERSION from cached wheel $WHEEL_DIR"
    fi
    "${PIP[@]}" install -q --no-deps --force-reinstall "$WHEEL_DIR"/mmcv-*.whl
fi

log "step 3/3: mmengine, mmdet, mmpretrain, mmseg, evaluation and test requirements, condtok_mm"
"${PIP[@]}" install -q "${CONSTRAINTS[@]}" -r requirements/runtime.txt -r requirements/mmpretrain.txt \
    -r requirements/coco.txt -r requirements/analysis.txt -r requirements/seg.txt -r requirements/tests.txt
"${PIP[@]}" install -q --no-deps --no-build-isolation -e .

check_mmcv_ops || die "mmcv.ops did not load its compiled extension (mmcv._ext); remove $WHEEL_DIR and rerun"
"$VPY" -c 'import condtok_mm, mmdet, mmpretrain; print("[install] condtok_mm", condtok_mm.__version__, "| mmdet", mmdet.__version__, "| mmpretrain", mmpretrain.__version__)'
stamp_value > "$STAMP"
log "done: activate with 'source .venv/bin/activate'"
