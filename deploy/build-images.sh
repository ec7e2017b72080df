#!/usr/bin/env bash
# `make images`: build every rlfleet image (replay, paramserver, learner, actor:
# the targets of ./Dockerfile; prometheus: deploy/prometheus/Dockerfile) the same
# way here and in CI.
#
# Base image (BASE_IMAGE):
#   unset   python:3.11-slim if it is present or can be pulled; otherwise a
#           Debian bookworm minbase + python3 + python3-venv made with
#           debootstrap and `docker import`ed as rlfleet/debian-python:bookworm
#           (cached: the image, and the rootfs tarball under $CACHE).
#   set     used as is (e.g. a mirror's python:3.11-slim).
# Wheelhouse (wheelhouse/): the project's pinned deps and the torch wheel are
# fetched on the host with pip (which trusts the host's certificates), so the
# image builds install with `pip --no-index` and never reach an index.
# WHEELHOUSE=0 skips it: images then install from the package index.
# Indexes and mirrors are the host's: pip's own configuration, and for the
# debootstrap base the first Debian URI of the host's apt sources; no host is
# named here. Where pip's index serves no CPU build of torch, TORCH_CPU_INDEX
# names one; CUDA_WHEELS=1 also fetches the CUDA torch into wheelhouse/cuda/
# (gigabytes; from TORCH_CUDA_INDEX if set) and builds
# rlfleet/learner:$TAG-cuda with TORCH=cuda.
#
# Env: BASE_IMAGE, TAG (default latest), WHEELHOUSE (1), CACHE
# (~/.cache/rlfleet), PYTHON (.venv/bin/python or python3), MIRROR (Debian;
# default: the host's apt sources), TORCH_CPU_INDEX, CUDA_WHEELS (0),
# TORCH_CUDA_INDEX, PIP_INDEX_URL and TORCH_INDEX_URL (WHEELHOUSE=0 builds).
set -euo pipefail
cd "$(dirname "$0")/.."

TAG=${TAG:-latest}
CACHE=${CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/rlfleet}
DEBIAN_BASE=rlfleet/debian-python:bookworm
PYTHON=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
TORCH_VERSION=2.13.0
log() { printf '[images] %s\n' "$*" >&2; }
now() { date +%s; }
T0=$(now)

docker info >/dev/null 2>&1 || { log "docker engine not reachable (is dockerd running?)"; exit 1; }

# The legacy builder needs no buildx plugin; BuildKit is used when buildx is there.
if [ -z "${DOCKER_BUILDKIT:-}" ]; then
    if docker buildx version >/dev/null 2>&1; then export DOCKER_BUILDKIT=1; else export DOCKER_BUILDKIT=0; fi
fi

# -- base image -------------------------------------------------------------
host_apt_mirror() {  # the first URI of the host's apt sources (one-line and deb822 formats), or nothing
    # a missing sources file (or awk's early exit cutting cat's pipe) is no error here: set -e and
    # pipefail would otherwise end the script silently inside MIRROR=$(...)
    { cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null || true; } \
        | awk '/^deb / { for (i = 2; i <= NF; i++) if ($i ~ /:\/\//) { print $i; exit } }
               /^URIs:/ { print $2; exit }'
}

debian_base() {
    if docker image inspect "$DEBIAN_BASE" >/dev/null 2>&1; then
        log "base: $DEBIAN_BASE (cached image)"; return
    fi
    local tarball="$CACHE/bookworm-python3.tar"
    if [ ! -s "$tarball" ]; then
        command -v debootstrap >/dev/null || { log "debootstrap missing: apt-get install debootstrap"; exit 1; }
        MIRROR=${MIRROR:-$(host_apt_mirror)}
        [ -n "$MIRROR" ] || { log "MIRROR: no Debian URI in the host's apt sources; set MIRROR to a Debian mirror"; exit 1; }
        mkdir -p "$CACHE"
        local root
        root=$(mktemp -d /tmp/rlfleet-rootfs.XXXXXX)
        log "base: debootstrap bookworm minbase + python3 into $root (about a minute)"
        debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
            bookworm "$root" "$MIRROR" >"$CACHE/debootstrap.log" 2>&1 \
            || { tail -20 "$CACHE/debootstrap.log" >&2; exit 1; }
        # What no service needs at run time: apt lists and caches, docs, locales.
        rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/usr/share/doc/* \
               "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/usr/share/locale/* "$root"/var/log/*
        tar -C "$root" --numeric-owner -cf "$tarball.tmp" .
        mv "$tarball.tmp" "$tarball"
        rm -rf "$root"
    else
        log "base: cached rootfs $tarball"
    fi
    docker import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8' \
        --change 'CMD ["python3"]' \
        "$tarball" "$DEBIAN_BASE" >/dev/null
    log "base: imported $DEBIAN_BASE"
}

if [ -z "${BASE_IMAGE:-}" ]; then
    if docker image inspect python:3.11-slim >/dev/null 2>&1 \
        || timeout 120 docker pull -q python:3.11-slim >/dev/null 2>&1; then
        BASE_IMAGE=python:3.11-slim
        log "base: python:3.11-slim"
    else
        log "base: python:3.11-slim cannot be pulled here; building it with debootstrap"
        debian_base
        BASE_IMAGE=$DEBIAN_BASE
    fi
fi
T_BASE=$(now)

# -- wheelhouse -------------------------------------------------------------
if [ "${WHEELHOUSE:-1}" = 1 ]; then
    stamp=wheelhouse/.stamp
    want=$(cat deploy/docker/requirements.txt; echo "torch==$TORCH_VERSION")
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
        log "wheelhouse: up to date"
    else
        log "wheelhouse: pip download of the pinned deps and torch $TORCH_VERSION (CPU)"
        find wheelhouse -maxdepth 1 -name '*.whl' -delete
        # torch alone first (from TORCH_CPU_INDEX if set, else pip's configured index and find-links), checked to
        # be the CPU build before anything else is fetched; then the pinned deps and torch's own from pip's
        # index, torch itself from the wheelhouse (V+cpu sorts above V).
        "$PYTHON" -m pip download -q --only-binary=:all: --no-deps -d wheelhouse --find-links wheelhouse \
            ${TORCH_CPU_INDEX:+--index-url "$TORCH_CPU_INDEX"} "torch==$TORCH_VERSION"
        if ! ls wheelhouse/torch-"$TORCH_VERSION"+cpu*.whl >/dev/null 2>&1; then
            log "wheelhouse: pip's index gave no CPU build of torch $TORCH_VERSION" \
                "($(cd wheelhouse && ls torch-*.whl 2>/dev/null)); set TORCH_CPU_INDEX to an index that serves it"
            find wheelhouse -maxdepth 1 -name 'torch-*.whl' -delete
            exit 1
        fi
        "$PYTHON" -m pip download -q --only-binary=:all: -d wheelhouse --find-links wheelhouse \
            "torch==$TORCH_VERSION" -r deploy/docker/requirements.txt
        printf '%s' "$want" >"$stamp"
    fi
    if [ "${CUDA_WHEELS:-0}" = 1 ]; then
        log "wheelhouse/cuda: pip download of torch $TORCH_VERSION with CUDA and its nvidia-* wheels"
        "$PYTHON" -m pip download -q --only-binary=:all: -d wheelhouse/cuda \
            ${TORCH_CUDA_INDEX:+--index-url "$TORCH_CUDA_INDEX"} "torch==$TORCH_VERSION"
        if ls wheelhouse/cuda/torch-*+cpu*.whl >/dev/null 2>&1; then
            log "wheelhouse/cuda: the index gave the CPU build of torch; set TORCH_CUDA_INDEX"; exit 1
        fi
    fi
else
    log "wheelhouse: off (WHEELHOUSE=0): images install from the package index"
    find wheelhouse -name '*.whl' -delete; rm -f wheelhouse/.stamp
fi
T_WHEELS=$(now)

# -- images -----------------------------------------------------------------
# Without a wheelhouse the builds install from the host's pip index (its configuration) and, for torch,
# TORCH_INDEX_URL if set: build args, passed only when there is a value.
INDEX_ARGS=()
PIP_INDEX_URL=${PIP_INDEX_URL:-$("$PYTHON" -m pip config get global.index-url 2>/dev/null || true)}
[ -z "$PIP_INDEX_URL" ] || INDEX_ARGS+=(--build-arg "PIP_INDEX_URL=$PIP_INDEX_URL")
[ -z "${TORCH_INDEX_URL:-}" ] || INDEX_ARGS+=(--build-arg "TORCH_INDEX_URL=$TORCH_INDEX_URL")
build() {  # name [docker build args...]
    local name=$1; shift
    local t
    t=$(now)
    if ! docker build -q --build-arg "BASE_IMAGE=$BASE_IMAGE" "${INDEX_ARGS[@]}" -t "rlfleet/$name:$TAG" "$@" . \
            >"$CACHE/build-$name.log" 2>&1; then
        tail -30 "$CACHE/build-$name.log" >&2; log "build of rlfleet/$name failed"; exit 1
    fi
    log "rlfleet/$name:$TAG built in $(( $(now) - t )) s"
}
mkdir -p "$CACHE"
# One Dockerfile, a target a service; the torch-free ones first (see the Dockerfile).
for name in replay paramserver learner actor; do
    build "$name" --target "$name"
done
build prometheus -f deploy/prometheus/Dockerfile
if [ "${CUDA_WHEELS:-0}" = 1 ]; then  # its own tag: rlfleet/learner:$TAG stays the CPU one
    t=$(now)
    docker build -q --build-arg "BASE_IMAGE=$BASE_IMAGE" "${INDEX_ARGS[@]}" --build-arg TORCH=cuda --target learner \
        -t "rlfleet/learner:$TAG-cuda" . >"$CACHE/build-learner-cuda.log" 2>&1 \
        || { tail -30 "$CACHE/build-learner-cuda.log" >&2; log "build of rlfleet/learner:$TAG-cuda failed"; exit 1; }
    log "rlfleet/learner:$TAG-cuda built in $(( $(now) - t )) s"
fi

log "done in $(( $(now) - T0 )) s (base $(( T_BASE - T0 )) s, wheelhouse $(( T_WHEELS - T_BASE )) s," \
    "images $(( $(now) - T_WHEELS )) s); BASE_IMAGE=$BASE_IMAGE"
docker image ls --format '{{.Repository}}:{{.Tag}} {{.Size}}' 'rlfleet/*' >&2
