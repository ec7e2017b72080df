#!/bin/sh
# Dependency stages of the Dockerfile: a venv in $1 (made unless it is there)
# with the pinned deps and, per $2 (cpu | cuda | none), torch. strip-venv.sh
# then removes what no service runs.
# With wheels in /tmp/wheelhouse (made by `make images`, or copied in for an
# air-gapped build) nothing is fetched: pip runs with --no-index. Otherwise
# packages come from the index (PyPI; the CPU torch build from PyTorch's).
set -eu
venv=$1
torch=$2
case "$torch" in
    cpu|cuda|none) ;;
    *) echo "TORCH=$torch: allowed: cpu, cuda, none" >&2; exit 2 ;;
esac
[ -x "$venv/bin/pip" ] || python3 -m venv "$venv"
pip="$venv/bin/pip --no-cache-dir --disable-pip-version-check"
if ls /tmp/wheelhouse/*.whl >/dev/null 2>&1; then
    echo "installing from the wheelhouse only"
    $pip install --no-index --find-links /tmp/wheelhouse -r /tmp/build/requirements.txt
    [ "$torch" = none ] || $pip install --no-index --find-links /tmp/wheelhouse torch==2.13.0
else
    echo "no wheelhouse: installing from the package index"
    $pip install -r /tmp/build/requirements.txt
    case "$torch" in
        cpu) $pip install --index-url https://download.pytorch.org/whl/cpu \
                 --extra-index-url https://pypi.org/simple torch==2.13.0 ;;
        cuda) $pip install torch==2.13.0 ;;
        none) ;;
    esac
fi
