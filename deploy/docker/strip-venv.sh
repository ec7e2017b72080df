#!/bin/sh
# Last step of a dependency stage: remove from the venv in $1 what a service
# never runs (headers, pip itself, test caches), before the images copy it.
set -eu
venv=$1
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
rm -rf "$site/torch/include" "$site/torch/share/cmake" "$site"/pip "$site"/pip-*.dist-info "$venv/bin/pip"*
find "$venv" -name '__pycache__' -path '*/tests/*' -prune -exec rm -rf {} + 2>/dev/null || true
