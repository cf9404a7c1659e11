#!/usr/bin/env bash
# Install the pinned OpenMMLab stack and condtok_mm into ./.venv (called by `make install`).
#
# Order matters and each step covers a known break of the pinned stack:
#   1. torch/torchvision and build tools first: mmcv's setup.py imports torch at build time, and
#      mmcv's setup.py plus mmengine's `mmdet::` config lookup import pkg_resources (setuptools<81).
#   2. mmcv 2.1.0 compiled from its source release (PyPI has no wheel for torch 2.14): CUDA ops for the
#      visible GPUs' architectures where torch sees a GPU and nvcc is there, CPU ops otherwise
#      (tools/mmcv_build.py decides, and stops naming the fix where a GPU has no usable nvcc; FORCE_CUDA=0
#      forces CPU ops, FORCE_CUDA=1 with TORCH_CUDA_ARCH_LIST builds CUDA ops on a host without a GPU);
#      with `-std=c++17` patched to `-std=c++20` (torch 2.14's headers refuse C++17) and
#      --no-build-isolation (an isolated build cannot see torch and silently drops mmcv._ext).
#      The wheel is cached outside the repo under its build tag (cpu, or CUDA version and architectures,
#      e.g. cu13.0-sm90) so a reinstall skips the compile (~10 minutes on 2 cores for CPU ops).
#   3. mmengine/mmdet/mmpretrain, evaluation, deployment (ONNX) and test requirements, then condtok_mm (editable).
# Every pip call installs the exact versions of requirements/constraints.txt (setup.py itself declares ranges).
# Idempotent: a stamp records the hash of every requirement file, of this script and of the mmcv build
# chosen; when it matches and mmcv's ops run (on the GPU too for a CUDA build), nothing is done.
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

# The mmcv build this machine gets (needs torch in the venv): sets MMCV_FORCE_CUDA, MMCV_ARCH_LIST,
# MMCV_CUDA_HOME and MMCV_BUILD_TAG, or stops with the fix tools/mmcv_build.py names.
choose_mmcv_build() {
    local choice key value
    choice=$("$VPY" tools/mmcv_build.py choose) || exit 1
    while IFS='=' read -r key value; do
        case $key in
            FORCE_CUDA) MMCV_FORCE_CUDA=$value ;;
            TORCH_CUDA_ARCH_LIST) MMCV_ARCH_LIST=$value ;;
            CUDA_HOME) MMCV_CUDA_HOME=$value ;;
            MMCV_BUILD_TAG) MMCV_BUILD_TAG=$value ;;
        esac
    done <<<"$choice"
}

check_mmcv_ops() {
    "$VPY" tools/mmcv_build.py check "$MMCV_BUILD_TAG"
}

stamp_value() {
    { cat requirements/*.txt setup.py tools/install.sh tools/mmcv_build.py; echo "$MMCV_BUILD_TAG"; } \
        | sha256sum | cut -d' ' -f1
}

if [ -f "$STAMP" ] && [ -x "$VPY" ]; then
    choose_mmcv_build
    if [ "$(cat "$STAMP")" = "$(stamp_value)" ] && check_mmcv_ops >/dev/null 2>&1; then
        log "already installed in $VENV (mmcv build $MMCV_BUILD_TAG; delete $STAMP to force a reinstall)"
        exit 0
    fi
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

choose_mmcv_build
TORCH_VERSION=$("$VPY" -c 'import torch; print(torch.__version__.split("+")[0])')
PY_TAG=$("$VPY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
WHEEL_DIR="$CACHE/wheels/mmcv-$MMCV_VERSION-torch$TORCH_VERSION-$PY_TAG-$MMCV_BUILD_TAG"

if "$VPY" -c "import mmcv, sys; sys.exit(mmcv.__version__ != '$MMCV_VERSION')" 2>/dev/null \
        && check_mmcv_ops >/dev/null 2>&1; then
    log "step 2/3: mmcv $MMCV_VERSION with compiled ops ($MMCV_BUILD_TAG) already installed"
else
    if ! ls "$WHEEL_DIR"/mmcv-*.whl >/dev/null 2>&1; then
        log "step 2/3: compiling mmcv $MMCV_VERSION ($MMCV_BUILD_TAG) against torch $TORCH_VERSION on $(nproc) cores"
        BUILD=$(mktemp -d)
        trap 'rm -rf "$BUILD"' EXIT
        "${PIP[@]}" download -q --no-deps --no-binary :all: "mmcv==$MMCV_VERSION" -d "$BUILD"
        tar -xzf "$BUILD"/mmcv-"$MMCV_VERSION".tar.gz -C "$BUILD"
        SRC="$BUILD/mmcv-$MMCV_VERSION"
        grep -q -- '-std=c++17' "$SRC/setup.py" || die "mmcv setup.py no longer has -std=c++17; re-check the C++20 patch"
        sed -i 's/-std=c++17/-std=c++20/g' "$SRC/setup.py"
        if [ "$MMCV_FORCE_CUDA" = 1 ]; then
            BUILD_ENV=(FORCE_CUDA=1 "TORCH_CUDA_ARCH_LIST=$MMCV_ARCH_LIST" "CUDA_HOME=$MMCV_CUDA_HOME")
        else  # mmcv's setup.py (L255) compiles CUDA ops whenever torch sees a GPU: hide them
            BUILD_ENV=(FORCE_CUDA=0 CUDA_VISIBLE_DEVICES=)
        fi
        mkdir -p "$WHEEL_DIR.tmp"
        started=$SECONDS
        env "${BUILD_ENV[@]}" CFLAGS=-g0 MAX_JOBS="${MAX_JOBS:-$(nproc)}" MMCV_WITH_OPS=1 \
            "${PIP[@]}" wheel -q --no-build-isolation --no-deps "$SRC" -w "$WHEEL_DIR.tmp"
        printf 'mmcv %s (%s) compiled in %d s with MAX_JOBS=%s on %s cores (%s)\n' "$MMCV_VERSION" "$MMCV_BUILD_TAG" \
            $((SECONDS - started)) "${MAX_JOBS:-$(nproc)}" "$(nproc)" "$(uname -m)" >"$WHEEL_DIR.tmp/build.txt"
        rm -rf "$WHEEL_DIR" && mv "$WHEEL_DIR.tmp" "$WHEEL_DIR"   # publish the cache entry whole
        log "$(cat "$WHEEL_DIR/build.txt")"
    else
        log "step 2/3: mmcv $MMCV_VERSION ($MMCV_BUILD_TAG) from cached wheel $WHEEL_DIR"
    fi
    "${PIP[@]}" install -q --no-deps --force-reinstall "$WHEEL_DIR"/mmcv-*.whl
    # what tools/gpu_check.sh reports as the build (absent for a wheel cached before build.txt existed)
    cp "$WHEEL_DIR/build.txt" "$VENV/.condtok_mm-mmcv-build.txt" 2>/dev/null || rm -f "$VENV/.condtok_mm-mmcv-build.txt"
fi

log "step 3/3: mmengine, mmdet, mmpretrain, mmseg, evaluation, deployment and test requirements, condtok_mm"
"${PIP[@]}" install -q "${CONSTRAINTS[@]}" -r requirements/runtime.txt -r requirements/mmpretrain.txt \
    -r requirements/coco.txt -r requirements/analysis.txt -r requirements/seg.txt -r requirements/tensorboard.txt \
    -r requirements/deploy.txt -r requirements/tests.txt
"${PIP[@]}" install -q --no-deps --no-build-isolation -e .
# mim finds a package's configs, tools and model index in <its distribution's location>/<package>/.mim
# (mim/utils/utils.py get_installed_path): an egg-link's checkout for the `setup.py develop` installs mmdet's setup
# was written for, site-packages for a PEP 660 editable install, where no condtok_mm folder is. A link there to the
# checkout's package gives `mim search/train/test/run condtok_mm` the .mim folder that a wheel install ships.
SITE_PACKAGES=$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
ln -sfn "$ROOT/condtok_mm" "$SITE_PACKAGES/condtok_mm"

check_mmcv_ops || die "mmcv's compiled ops ($MMCV_BUILD_TAG) do not work; remove $WHEEL_DIR and rerun"
"$VPY" -c 'import condtok_mm, mmdet, mmpretrain; print("[install] condtok_mm", condtok_mm.__version__, "| mmdet", mmdet.__version__, "| mmpretrain", mmpretrain.__version__)'
stamp_value > "$STAMP"
log "done: activate with 'source .venv/bin/activate'"
