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
#
# Env: BASE_IMAGE, TAG (default latest), WHEELHOUSE (1), CACHE
# (~/.cache/rlfleet), PYTHON (.venv/bin/python or python3), MIRROR (Debian).
set -euo pipefail
cd "$(dirname "$0")/.."

TAG=${TAG:-latest}
CACHE=${CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/rlfleet}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
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
debian_base() {
    if docker image inspect "$DEBIAN_BASE" >/dev/null 2>&1; then
        log "base: $DEBIAN_BASE (cached image)"; return
    fi
    local tarball="$CACHE/bookworm-python3.tar"
    if [ ! -s "$tarball" ]; then
        command -v debootstrap >/dev/null || { log "debootstrap missing: apt-get install debootstrap"; exit 1; }
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
        find wheelhouse -name '*.whl' -delete
        # torch: a local CPU wheel if pip's find-links has one, else PyTorch's CPU index.
        if ! "$PYTHON" -m pip download -q --only-binary=:all: -d wheelhouse "torch==$TORCH_VERSION" \
                -r deploy/docker/requirements.txt 2>/dev/null \
            || ! ls wheelhouse/torch-"$TORCH_VERSION"*cpu*.whl >/dev/null 2>&1; then
            find wheelhouse -name 'torch-*.whl' -delete
            "$PYTHON" -m pip download -q --only-binary=:all: -d wheelhouse \
                --index-url https://download.pytorch.org/whl/cpu --extra-index-url https://pypi.org/simple \
                "torch==$TORCH_VERSION" -r deploy/docker/requirements.txt
        fi
        printf '%s' "$want" >"$stamp"
    fi
else
    log "wheelhouse: off (WHEELHOUSE=0): images install from the package index"
    find wheelhouse -name '*.whl' -delete; rm -f wheelhouse/.stamp
fi
T_WHEELS=$(now)

# -- images -----------------------------------------------------------------
build() {  # name [docker build args...]
    local name=$1; shift
    local t
    t=$(now)
    if ! docker build -q --build-arg "BASE_IMAGE=$BASE_IMAGE" -t "rlfleet/$name:$TAG" "$@" . \
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

log "done in $(( $(now) - T0 )) s (base $(( T_BASE - T0 )) s, wheelhouse $(( T_WHEELS - T_BASE )) s," \
    "images $(( $(now) - T_WHEELS )) s); BASE_IMAGE=$BASE_IMAGE"
docker image ls --format '{{.Repository}}:{{.Tag}} {{.Size}}' 'rlfleet/*' >&2
