# User-facing verbs of the patch set. `make wheel` and `make test` are all a newcomer needs (docs/development.md).
PYTHON ?= python3
VENV ?= .venv
PY ?=
ARCH ?=
VERSION ?=
UPSTREAM_SRC ?=
DRY_RUN ?=
TARGET ?=
AUTHOR ?=
TOOL = PYTHONPATH=scripts $(PYTHON) -m vllm_ascend_patchset
TARGET_ARGS = $(if $(PY),--py $(PY)) $(if $(ARCH),--arch $(ARCH))
PYTEST_ARGS ?=
RUN ?=
E2E_VENV ?= .cache/e2e/venv
BENCH_E2E_ARGS ?=
BENCH_DS_ARGS ?=
BENCH_E2E_DS_ARGS ?=
ARGS ?=

.PHONY: wheel wheels assemble test test-fast upstream-ut venv diffs config-docs check-pin port lint format bench bench-traces bench-ds e2e-env e2e bench-e2e bench-e2e-ds results doc-images clean help

wheel:            ## patched wheel for this machine (or PY=cp310 ARCH=aarch64)
	$(TOOL) wheel $(TARGET_ARGS)

wheels:           ## all pinned targets
	$(TOOL) wheel --all

assemble:         ## build/<target>/vllm_ascend only
	$(TOOL) assemble $(TARGET_ARGS)

venv:             ## the CPU test environment in .venv
	@$(PYTHON) -c 'import sys; v = sys.version_info; sys.exit(0 if (3, 11) <= v[:2] <= (3, 12) else f"the test environment needs Python 3.11 or 3.12 as python3 (found {v.major}.{v.minor}): its pinned numpy and scipy need 3.11, the pinned upstream wheels are built up to 3.12; PYTHON=python3.11 make test uses another")'
	VENV=$(VENV) PYTHON=$(PYTHON) bash scripts/setup_test_env.sh

test: venv assemble  ## every test (the README's and CI's command)
	$(VENV)/bin/python -m pytest tests $(PYTEST_ARGS)

test-fast: venv   ## the tests that need neither vLLM, torch nor the assembled tree (tests/tiers.py), on two processes
	$(VENV)/bin/python tests/shards.py 2 tests --fast -q $(PYTEST_ARGS)

upstream-ut: venv assemble  ## upstream's CPU unit tests with the series against upstream as released (ARGS=tests/ut/core: those alone)
	PYTHONPATH=scripts $(VENV)/bin/python -m vllm_ascend_patchset upstream-ut $(TARGET_ARGS) $(ARGS)

diffs:            ## git am-able series per feature under dist/upstream/ (TARGET=main UPSTREAM_SRC=path: dist/upstream-main/; AUTHOR='Name <mail>')
	@test -z "$(UPSTREAM_SRC)" || test -n "$(TARGET)" || { echo "make diffs: UPSTREAM_SRC is read only with TARGET=<name> (patches/targets/); without it the series is for the pinned release and needs no checkout" >&2; exit 2; }
	$(TOOL) diffs $(TARGET_ARGS) $(if $(TARGET),--target $(TARGET) --upstream-src "$(UPSTREAM_SRC)") $(if $(AUTHOR),--author "$(AUTHOR)")

config-docs: venv ## rewrite the config tables of docs/cpp.md and docs/dual-stream.md from the code
	PYTHONPATH=scripts $(VENV)/bin/python -m vllm_ascend_patchset config-docs $(TARGET_ARGS)

check-pin:        ## does the series apply to another release? make check-pin VERSION=x.y.z
	@test -n "$(VERSION)" || { echo "usage: make check-pin VERSION=x.y.z" >&2; exit 2; }
	$(TOOL) check-pin $(TARGET_ARGS) $(VERSION)

port:             ## merge the series into a vllm-ascend git checkout and report: make port UPSTREAM_SRC=path [DRY_RUN=1]
	@test -n "$(UPSTREAM_SRC)" || { echo "usage: make port UPSTREAM_SRC=<vllm-ascend git checkout> [DRY_RUN=1]" >&2; exit 2; }
	$(TOOL) port "$(UPSTREAM_SRC)" $(TARGET_ARGS) $(if $(TARGET),--target $(TARGET)) $(if $(filter-out 0 no false,$(DRY_RUN)),--dry-run)

bench: venv assemble  ## CPP twin: vLLM fixed, tuned fixed, upstream CPP, ours and the optimum on both surfaces
	for surface in tests/data/cpu_surface.csv synthetic; do \
	  PYTHONPATH=scripts $(VENV)/bin/python -m vllm_ascend_patchset cpp-twin --surface $$surface \
	    --workload long:32k,long:128k,long:256k --stages 2,4,8 || exit 1; \
	  PYTHONPATH=scripts $(VENV)/bin/python -m vllm_ascend_patchset cpp-twin --surface $$surface \
	    --workload mixed --stages 4 || exit 1; \
	done
	$(MAKE) --no-print-directory bench-traces
	PYTHONPATH=scripts $(VENV)/bin/python scripts/bench/predictor.py

# Replayed Mooncake traffic (docs/cpp-twin.md): three slices x three loads x P = 2, 4, one invocation per
# surface, both surfaces side by side (their logs are printed when both are done), then one summary table.
TRACE = tests/data/traces/mooncake.jsonl
TRACE_ARGS = --workload trace:$(TRACE)@0:32,trace:$(TRACE)@32:32,trace:$(TRACE)@64:32 \
  --load 0.5,0.8,0.95 --stages 2,4 --sweep 256,4096
BENCH_OUT = build/bench

bench-traces: venv assemble  ## CPP twin on replayed Mooncake traffic: TTFT, TPOT and goodput per policy
	mkdir -p $(BENCH_OUT)
	PYTHONPATH=scripts $(VENV)/bin/python -m vllm_ascend_patchset cpp-twin --surface tests/data/cpu_surface.csv \
	  $(TRACE_ARGS) --json $(BENCH_OUT)/traces-cpu.json > $(BENCH_OUT)/traces-cpu.txt 2>&1 & cpu=$$!; \
	PYTHONPATH=scripts $(VENV)/bin/python -m vllm_ascend_patchset cpp-twin --surface synthetic \
	  $(TRACE_ARGS) --json $(BENCH_OUT)/traces-synthetic.json > $(BENCH_OUT)/traces-synthetic.txt 2>&1 & syn=$$!; \
	wait $$cpu; a=$$?; wait $$syn; b=$$?; cat $(BENCH_OUT)/traces-cpu.txt $(BENCH_OUT)/traces-synthetic.txt; \
	test $$a = 0 && test $$b = 0
	PYTHONPATH=scripts $(VENV)/bin/python -m vllm_ascend_patchset.twin.summary \
	  $(BENCH_OUT)/traces-cpu.json $(BENCH_OUT)/traces-synthetic.json

bench-ds: venv assemble  ## dual stream against single stream on the CPU, TP=2, emulated links (docs/dual-stream.md)
	PYTHONPATH=scripts $(VENV)/bin/python -m vllm_ascend_patchset ds-bench $(BENCH_DS_ARGS)

e2e-env:          ## vLLM 0.23.0's CPU engine in $(E2E_VENV), apart from .venv (docs/e2e.md)
	E2E_VENV=$(abspath $(E2E_VENV)) PYTHON=$(PYTHON) bash scripts/setup_e2e_env.sh

e2e: e2e-env assemble  ## smokes: CPP at PP=2 (profile, serve, restart from its cache); dual stream at TP=2 and, with CPP, PP=2 x TP=2
	PYTHONPATH=scripts $(E2E_VENV)/bin/python -m vllm_ascend_patchset.e2e.run smoke
	PYTHONPATH=scripts $(E2E_VENV)/bin/python -m vllm_ascend_patchset.e2e.run ds-smoke

bench-e2e-ds: e2e-env assemble  ## real CPU engine, TP=2: prefill time with dual stream on / off over an emulated link
	PYTHONPATH=scripts $(E2E_VENV)/bin/python -m vllm_ascend_patchset.e2e.run ds-bench $(BENCH_E2E_DS_ARGS)

bench-e2e: venv e2e-env assemble  ## real CPU engine: fixed chunks, upstream's CPP, ours, and the twin's prediction
	PYTHONPATH=scripts $(E2E_VENV)/bin/python -m vllm_ascend_patchset.e2e.run bench \
	  --twin-python $(abspath $(VENV))/bin/python $(BENCH_E2E_ARGS)

results: venv     ## rewrite docs/results.md from the saved bench outputs in docs/results/ (RUN=name,...: run those benches anew first)
	PYTHONPATH=scripts $(VENV)/bin/python scripts/bench/results.py $(if $(RUN),--run $(RUN))

doc-images: venv assemble  ## draw docs/images/ again: the twin's Gantt chart of a 32k prompt, the dual-stream timeline
	PYTHONPATH=scripts $(VENV)/bin/python scripts/bench/doc_images.py

lint: venv        ## ruff check + format check through the pre-commit local hooks
	PATH=$(abspath $(VENV))/bin:$$PATH $(VENV)/bin/pre-commit run --all-files

format: venv      ## apply ruff's fixes and formatting
	$(VENV)/bin/ruff check --fix . && $(VENV)/bin/ruff format .

clean:            ## remove build/ and dist/ (the caches under .cache/ stay)
	rm -rf build dist

help:             ## this list
	@grep -E '^[a-z][a-z0-9-]*:.*## ' $(MAKEFILE_LIST) | sed -E 's/:[^#]*## /\t/' | expand -t 18
