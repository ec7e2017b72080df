# rlfleet: `make run` trains CartPole through real services; `make test` runs the suite.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup run test test-multinode test-fast lint bench clean images

setup: $(STAMP)

# torch first, by exact version: on CPU-only machines pip finds the local CPU
# wheel (no CUDA download); everything else is pinned in pyproject.toml.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: setup
	$(BIN)/rlfleet up --config configs/cartpole-dqn.yaml --actors 2 --until-return 475

# pytest exits 5 when it collected no test: make treats that as a failure too.
test: setup
	$(BIN)/python -m pytest -q --durations=15 -m "not multinode"

# A second Docker engine joined as a swarm worker (tests/containers/test_swarm_two_nodes.py): ~15 min, root.
test-multinode: setup
	$(BIN)/python -m pytest -q -s -m multinode tests/containers

test-fast: setup
	$(BIN)/python -m pytest -q -m "not e2e and not container and not chaos"

lint: setup
	$(BIN)/ruff check common services tests bench cli harness
	$(BIN)/mypy common services bench cli harness

clean:
	rm -rf $(VENV) runs .pytest_cache .mypy_cache .ruff_cache

# Every container image: the targets replay, paramserver, learner, actor of
# ./Dockerfile, and prometheus (deploy/prometheus/Dockerfile). Where
# python:3.11-slim cannot be pulled, the base is made with debootstrap (cached);
# deps come from a wheelhouse made on the host. See deploy/build-images.sh.
images: setup
	PYTHON=$(BIN)/python bash deploy/build-images.sh
