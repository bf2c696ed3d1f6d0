# Two commands work on a fresh machine with only Python 3.11: `make demo` and `make test`.
PY ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
GAMMA_REPS ?= 100
RR_RUNS ?= 50

.PHONY: install test test-fast demo bench bench-extra clean

# The project's bytecode, before the processes that import it: Python writes it on a first import unless
# PYTHONDONTWRITEBYTECODE is set (as on these machines), and then every process compiles pram_lib, flows and tasks
# again (0.3-0.4 s each: a run's helper, each test worker and each `pram-release` a test starts). Up-to-date files
# are left alone.
BYTECODE = $(BIN)/python -m compileall -q -j 0 pram_lib flows tasks > /dev/null

install: $(STAMP)

$(STAMP): requirements.txt constraints.txt pyproject.toml pram_lib/core/_fastpath.c
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check --no-compile -r requirements.txt -c constraints.txt
	$(BIN)/python -m compileall -q -j 0 -x '/tests?/' $(VENV)/lib > /dev/null    # bytecode on every core (pip's is serial); not the packages' own test suites (a fifth of the files)
	$(BIN)/python -m pip install -q --disable-pip-version-check --no-deps -e .
	$(BIN)/python -m pram_lib.core.fastpath    # the C kernel for family-(8) perturbation (cc; optional at run time)
	touch $(STAMP)

# make exits 2 whatever a recipe's code; PYTEST_RC_FILE=path keeps pytest's own (.ci/run reads it: 5 = no tests ran)
# pytest-xdist: a worker per core, each test file on one worker (its module fixtures are built once), files handed
# out in collection order (--no-loadscope-reorder: xdist would put files with few tests last, and the longest files
# have few; tests/conftest.py collects the longest first); on this 2-core machine the whole suite took 14 min
# instead of 23
test: $(STAMP)
	$(BYTECODE)
	$(BIN)/python -m pytest -q -p no:cacheprovider -n auto --dist loadfile --no-loadscope-reorder --durations=12 $(PYTEST_ARGS) || { rc=$$?; \
	  $(if $(PYTEST_RC_FILE),echo $$rc > "$(PYTEST_RC_FILE)";) exit $$rc; }

# the quick loop: every test but those marked slow (system tests, a Prefect server, statistical simulations)
test-fast: $(STAMP)
	$(BYTECODE)
	$(BIN)/python -m pytest -q -p no:cacheprovider -n auto --dist loadfile --no-loadscope-reorder -m "not slow" --durations=12 $(PYTEST_ARGS)

demo: $(STAMP)
	$(BYTECODE)
	bash scripts/demo.sh

BENCH_SITE := .bench-site
BENCH_STAMP := $(BENCH_SITE)/.installed

# peers for the perturbation benchmark: installed beside the venv, never into it (tests never see them)
$(BENCH_STAMP): requirements-bench.txt | $(STAMP)
	rm -rf $(BENCH_SITE)
	$(BIN)/python -m pip install -q --disable-pip-version-check --no-deps --target $(BENCH_SITE) -r requirements-bench.txt
	touch $(BENCH_STAMP)

# the scale benchmarks and benchmarks/RESULTS.md (about 10 minutes once the census files exist, 10^8-row releases included)
bench: $(STAMP) $(BENCH_STAMP)
	$(BIN)/python -m benchmarks.bench_optimal_pram --scaling-only
	$(BIN)/python -m benchmarks.bench_perturb
	$(BIN)/python -m benchmarks.bench_release
	$(BIN)/python -m benchmarks.bench_analysis
	$(BIN)/python -m benchmarks.bench_fixed_cost
	$(BIN)/python -m benchmarks.bench_estimate
	$(BIN)/python -m benchmarks.bench_memo
	$(BIN)/python -m benchmarks.bench_longitudinal
	$(BIN)/python -m benchmarks.results_md

# the method benchmarks and paper reproductions of issues 2-5 (text reports in benchmarks/results/)
bench-extra: $(STAMP)
	$(BIN)/python -m benchmarks.bench_optimal_pram
	$(BIN)/python -m benchmarks.bench_gamma
	$(BIN)/python -m benchmarks.gamma_simulation --reps $(GAMMA_REPS)
	$(BIN)/python -m benchmarks.bench_multi_rr
	$(BIN)/python -m benchmarks.bench_accurate
	$(BIN)/python -m benchmarks.bench_binning
	$(BIN)/python -m benchmarks.rr_clusters_experiment --runs $(RR_RUNS)

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info $(BENCH_SITE) pram_lib/core/_fastpath.so
