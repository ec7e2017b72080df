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
	$(BIN)/python -m pytest -q --durations=40 -m "not multinode and not slow"

# The long runs left out of make test (docs/testing.md): before a release, beside make test-multinode.
test-slow: setup
	$(BIN)/python -m pytest -q --durations=15 -m slow

# A second Docker engine joined as a swarm worker (tests/containers/test_swarm_two_nodes.py): ~20 min, root.
test-multinode: setup
	$(BIN)/python -m pytest -q -s -m multinode tests/containers

test-fast: setup
	$(BIN)/python -m pytest -q -m "not e2e and not container and not chaos"

lint: setup
	$(BIN)/ruff check common services tests bench cli harness rlfleet
	$(BIN)/mypy rlfleet bench harness

clean:
	rm -rf $(VENV) runs .pytest_cache .mypy_cache .ruff_cache

# Every container image: the targets replay, paramserver, learner, actor of
# ./Dockerfile, and prometheus (deploy/prometheus/Dockerfile). Where
# python:3.11-slim cannot be pulled, the base is made with debootstrap (cached);
# deps come from a wheelhouse made on the host. See deploy/build-images.sh.
images: setup
	PYTHON=$(BIN)/python bash deploy/build-images.sh

# Mutation testing, outside CI (docs/testing.md#mutation-testing): mutmut mutates the modules where a
# silent bug loses data or learning ([tool.mutmut] in pyproject.toml) and runs each mutant against the
# unit tests that call the mutated function; then one line per module. One module:
# make mutate MUTANTS='rlfleet.services.replay.sumtree*'. Slow: it runs at idle priority.
MUTANTS ?= rlfleet.services.replay.sumtree* rlfleet.services.replay.ratelimiter* \
	rlfleet.common.algorithms.adders.nstep* rlfleet.common.algorithms.ppo.losses* \
	rlfleet.common.algorithms.sac.learner.xǁSACLearnerǁ_gradients* \
	rlfleet.common.algorithms.sac.learner.xǁSACLearnerǁafter_update* rlfleet.common.wire.dedup* \
	rlfleet.common.wire.decoder*
.PHONY: mutate
mutate: setup
	set -f; for m in $(MUTANTS); do nice -n 19 $(BIN)/mutmut run "$$m" </dev/null || exit 1; done
	$(BIN)/mutmut results --all true | awk -F': ' '/: / && $$2 != "not checked" {m = $$1; sub(/^ +/, "", m); sub(/\.x[_ǁ].*/, "", m); \
		n[m]++; s[m, $$2]++} END {for (m in n) printf "%s: %d mutants, %d killed, %d survived, %d other (no tests, timeout)\n", \
		m, n[m], s[m, "killed"], s[m, "survived"], n[m] - s[m, "killed"] - s[m, "survived"]}' | sort

# The distributed peers of bench.learning.time_to_solve --peer (docs/benchmarks.md#distributed-peers): one
# pinned virtualenv each under .peers/ (Sample Factory 2.1.1, RLlib 2.60.0), nothing of it in .venv; a second
# run leaves built venvs as they are.
.PHONY: peers
peers:
	bash bench/peers/setup.sh
