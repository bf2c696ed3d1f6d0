# Two commands work on a fresh machine with only Python 3.11: `make demo` and `make test`.
PY ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
GAMMA_REPS ?= 100
RR_RUNS ?= 50

.PHONY: install test demo bench clean

install: $(STAMP)

$(STAMP): requirements.txt constraints.txt pyproject.toml pram_lib/_fastpath.c
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check -r requirements.txt -c constraints.txt
	$(BIN)/python -m pip install -q --disable-pip-version-check --no-deps -e .
	$(BIN)/python -m pram_lib.fastpath    # the C kernel for family-(8) perturbation (cc; optional at run time)
	touch $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)

demo: $(STAMP)
	bash scripts/demo.sh

bench: $(STAMP)
	$(BIN)/python -m benchmarks.bench_optimal_pram
	$(BIN)/python -m benchmarks.bench_perturb
	$(BIN)/python -m benchmarks.bench_estimate
	$(BIN)/python -m benchmarks.bench_gamma
	$(BIN)/python -m benchmarks.gamma_simulation --reps $(GAMMA_REPS)
	$(BIN)/python -m benchmarks.bench_multi_rr
	$(BIN)/python -m benchmarks.rr_clusters_experiment --runs $(RR_RUNS)

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
