# Every rlfleet image, one target a service (the evaluator runs from the actor image):
#   docker build --target replay      -t rlfleet/replay .        # no torch
#   docker build --target paramserver -t rlfleet/paramserver .   # no torch
#   docker build --target learner     -t rlfleet/learner .       # CPU torch; --build-arg TORCH=cuda for GPUs
#   docker build --target actor       -t rlfleet/actor .         # CPU torch; `service evaluator` too
# `make images` (deploy/build-images.sh) builds them all. The context is the
# repository root, cut down by .dockerignore to rlfleet/, common/, services/, cli/,
# configs/, deploy/ (docker, prometheus) and wheelhouse/.
# Build args: BASE_IMAGE (any Debian-like image with python3.11 + venv),
# TORCH (cpu | cuda, the torch images only; cuda installs from wheelhouse/cuda/),
# PIP_INDEX_URL and TORCH_INDEX_URL (no wheelhouse only). With wheels in
# wheelhouse/ nothing is downloaded.
#
# Stage order matters to the legacy builder (no BuildKit), which builds every
# stage above the target: the torch-free targets come first, so building them
# never installs torch.
ARG BASE_IMAGE=python:3.11-slim

# -- dependencies: a venv in /opt/rlfleet --------------------------------------
FROM ${BASE_IMAGE} AS deps
# Without a wheelhouse: pip's index (and torch's) as the build passes them; none is named here
ARG PIP_INDEX_URL
ARG TORCH_INDEX_URL
COPY deploy/docker/install-deps.sh deploy/docker/strip-venv.sh deploy/docker/requirements.txt /tmp/build/
COPY wheelhouse/ /tmp/wheelhouse/
RUN sh /tmp/build/install-deps.sh /opt/rlfleet none

FROM deps AS deps-light
RUN sh /tmp/build/strip-venv.sh /opt/rlfleet

# -- the project's code, copied once for every target --------------------------
# One package, rlfleet: common/, services/ and cli/ are its subpackages (rlfleet/ links to them in the
# repository; here they are copied in), so the image has no top-level `common` either.
FROM scratch AS source
COPY rlfleet/*.py /app/rlfleet/
COPY common/ /app/rlfleet/common/
COPY services/ /app/rlfleet/services/
COPY cli/ /app/rlfleet/cli/

# -- what every service image shares -------------------------------------------
FROM ${BASE_IMAGE} AS service
# Non-root; its run directory holds checkpoints and snapshots (named volumes
# mount on run/learner and run/replay and inherit this ownership).
RUN useradd --uid 10001 --user-group --home-dir /var/lib/rlfleet --create-home --shell /usr/sbin/nologin rlfleet \
 && mkdir -p /var/lib/rlfleet/run/learner /var/lib/rlfleet/run/replay /etc/rlfleet \
 && chown -R rlfleet:rlfleet /var/lib/rlfleet
COPY configs/cartpole-dqn.yaml /etc/rlfleet/config.yaml
COPY deploy/docker/healthcheck.py /opt/rlfleet/healthcheck.py
ENV PATH=/opt/rlfleet/bin:$PATH \
    PYTHONPATH=/app \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    RLFLEET_RUN_DIR=/var/lib/rlfleet/run
USER rlfleet
WORKDIR /var/lib/rlfleet
EXPOSE 9100
HEALTHCHECK --interval=5s --timeout=4s --start-period=60s --retries=3 CMD ["python", "/opt/rlfleet/healthcheck.py"]
# Exec form: the service is PID 1 and gets SIGTERM itself (checkpoints, closes).
ENTRYPOINT ["python", "-m", "rlfleet.cli"]

# -- torch-free services --------------------------------------------------------
FROM service AS light
COPY --from=deps-light /opt/rlfleet /opt/rlfleet
COPY --from=source /app /app

FROM light AS replay
EXPOSE 5550
CMD ["service", "replay", "--config", "/etc/rlfleet/config.yaml"]

FROM light AS paramserver
EXPOSE 5560
CMD ["service", "paramserver", "--config", "/etc/rlfleet/config.yaml"]

# -- services with torch --------------------------------------------------------
FROM deps AS deps-torch
ARG TORCH=cpu
ARG PIP_INDEX_URL
ARG TORCH_INDEX_URL
RUN sh /tmp/build/install-deps.sh /opt/rlfleet "$TORCH" && sh /tmp/build/strip-venv.sh /opt/rlfleet

FROM service AS torch
COPY --from=deps-torch /opt/rlfleet /opt/rlfleet
COPY --from=source /app /app

FROM torch AS learner
CMD ["service", "learner", "--config", "/etc/rlfleet/config.yaml"]

FROM torch AS actor
CMD ["service", "actor", "--config", "/etc/rlfleet/config.yaml"]
