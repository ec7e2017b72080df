#!/usr/bin/env bash
# One virtualenv per distributed peer of bench.learning.time_to_solve under .peers/ (make peers), each
# pinned and built from the package registry only; nothing of it goes into the project's own .venv.
# Idempotent: a peer whose venv was built with the same pins is left as it is. Where a peer cannot be
# installed, pip's error is in .peers/<peer>.log and the other peers are still built (exit 1 at the end).
# bench/peers/setup.sh [sample-factory] [rllib]: only those; two runs at once build each venv once (a lock each).
set -uo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
PEERS="${PEERS_DIR:-$ROOT/.peers}"
PYTHON="${PYTHON:-python3.11}"

# torch 2.13.0 as the project's (on a CPU-only machine pip takes the local CPU wheel): the pin comes first
# so the peer's own requirements cannot pull another build.
# ale-py 0.9.1: the newest that runs under gymnasium 0.29 and carries its ROMs (bench.learning.pixels --peer).
SAMPLE_FACTORY=(torch==2.13.0 sample-factory==2.1.1 "numpy<2" gymnasium==0.29.1 box2d==2.3.10 pygame==2.6.1 ale-py==0.9.1)
RLLIB=(torch==2.13.0 "ray[rllib]==2.60.0" box2d==2.3.10 pygame==2.6.1)

build() {  # build NAME PINS...: .peers/NAME with exactly PINS, unless it already has them
    local name="$1"; shift
    local venv="$PEERS/$name" pins="$*"
    if [[ -f "$venv/.pins" && "$(cat "$venv/.pins")" == "$pins" ]]; then
        echo "$name: up to date ($venv)"
        return 0
    fi
    mkdir -p "$PEERS"
    exec {lock}> "$PEERS/$name.lock"
    flock "$lock"
    if [[ -f "$venv/.pins" && "$(cat "$venv/.pins")" == "$pins" ]]; then
        echo "$name: up to date ($venv)"
        return 0
    fi
    echo "$name: building $venv with $pins (log: $PEERS/$name.log)"
    rm -rf "$venv"
    if "$PYTHON" -m venv "$venv" > "$PEERS/$name.log" 2>&1 \
        && "$venv/bin/pip" install --quiet "$@" >> "$PEERS/$name.log" 2>&1; then
        "$venv/bin/pip" freeze > "$PEERS/$name.freeze.txt"
        echo "$pins" > "$venv/.pins"
        echo "$name: ready"
        return 0
    fi
    echo "$name: FAILED, pip's error:" >&2
    tail -n 20 "$PEERS/$name.log" >&2
    return 1
}

ARGS=("$@")
for name in "${ARGS[@]}"; do
    [[ "$name" == sample-factory || "$name" == rllib ]] || { echo "unknown peer $name: sample-factory, rllib" >&2; exit 2; }
done
wanted() { [[ ${#ARGS[@]} -eq 0 || " ${ARGS[*]} " == *" $1 "* ]]; }
status=0
if wanted sample-factory; then build sample-factory "${SAMPLE_FACTORY[@]}" || status=1; fi
if wanted rllib; then build rllib "${RLLIB[@]}" || status=1; fi
exit $status
