#!/bin/sh
# Dependency stages of the Dockerfile: a venv in $1 (made unless it is there)
# with the pinned deps and, per $2 (cpu | cuda | none), torch. strip-venv.sh
# then removes what no service runs.
# With wheels in the wheelhouse (/tmp/wheelhouse, made by `make images`, or
# copied in for an air-gapped build) nothing is fetched: pip runs with
# --no-index. The CPU torch wheel sits in the wheelhouse itself, the CUDA one
# (and its nvidia-* wheels) in its cuda/ folder, each installed from its own
# folder only: torch==V matches V+cpu too, so one folder holding both could
# hand TORCH=cuda the CPU wheel. Without wheels, packages come from pip's
# index: the one the build passes (build args PIP_INDEX_URL and, for torch,
# TORCH_INDEX_URL), no host named here. TORCH=cuda is checked at the end:
# the installed torch must report torch.version.cuda.
# Env (tests): RLFLEET_WHEELHOUSE (/tmp/wheelhouse), RLFLEET_BUILD (/tmp/build).
set -eu
venv=$1
torch=$2
wheels=${RLFLEET_WHEELHOUSE:-/tmp/wheelhouse}
build=${RLFLEET_BUILD:-/tmp/build}
case "$torch" in
    cpu|cuda|none) ;;
    *) echo "TORCH=$torch: allowed: cpu, cuda, none" >&2; exit 2 ;;
esac
[ -x "$venv/bin/pip" ] || python3 -m venv "$venv"
pip="$venv/bin/pip --no-cache-dir --disable-pip-version-check"
if ls "$wheels"/*.whl >/dev/null 2>&1; then
    echo "installing from the wheelhouse only"
    $pip install --no-index --find-links "$wheels" -r "$build/requirements.txt"
    case "$torch" in
        cpu) $pip install --no-index --find-links "$wheels" torch==2.13.0 ;;
        cuda)
            if ! ls "$wheels"/cuda/torch-*.whl >/dev/null 2>&1; then
                echo "TORCH=cuda: no torch wheel in the wheelhouse's cuda/ folder (CUDA_WHEELS=1" \
                     "deploy/build-images.sh fills it; the wheelhouse's own torch is the CPU build)" >&2
                exit 1
            fi
            $pip install --no-index --find-links "$wheels/cuda" torch==2.13.0 ;;
        none) ;;
    esac
else
    echo "no wheelhouse: installing from the package index"
    $pip install -r "$build/requirements.txt"
    if [ "$torch" != none ]; then
        [ -n "${TORCH_INDEX_URL:-}" ] || echo "TORCH=$torch: no TORCH_INDEX_URL: torch from pip's index," \
            "whatever build it serves for this platform" >&2
        $pip install ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} torch==2.13.0
    fi
fi
if [ "$torch" = cuda ]; then
    "$venv/bin/python" -c 'import sys, torch
sys.exit(0 if torch.version.cuda else "TORCH=cuda: torch %s has no CUDA (torch.version.cuda is None): '\
'the CPU wheel was installed" % torch.__version__)'
fi
