# The two commands a newcomer needs: `make demo` and `make test`.
# Both create .venv on first use; the control-plane binaries are built once into
# ~/.cache/kubetune (a few minutes cold) and reused afterwards.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test soak unit integration bench bench-quality e2e clean-venv postgres chromium docs

# uv installs what pip would (the same resolution from PyPI) in ~20 s where pip took ~160
# (CI builds .venv afresh on each run); pip is the fallback should uv fail
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet uv
	$(BIN)/uv pip install --quiet --python $(BIN)/python -e ".[test]" || $(BIN)/pip install --quiet -e ".[test]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/kubetune demo

# The unit tests in two processes (CPU-bound and independent of each other: the machine
# has two cores), then the integration tests in one (they share one control plane, one
# Ray and one node). Both always run; either failing, or running no test (pytest's exit
# code 5), fails the target.
test: $(STAMP) postgres chromium
	$(BIN)/kubetune devcluster build
	@# bytecode for the sources, once: with PYTHONDONTWRITEBYTECODE set (CI sets it) every
	@# operator, driver and Ray worker the tests start compiled them again (~0.4 s CPU each)
	$(BIN)/python -m compileall -q operator > /dev/null
	$(BIN)/python -m pytest tests/unit -q -ra -n 2 --durations=10; unit=$$?; \
	$(BIN)/python -m pytest tests/integration -q -ra --durations=25; integration=$$?; \
	test $$unit -eq 0 && test $$integration -eq 0

# the soak tests (tests/integration/soak.py) at the full sizes the issues name; `make test`
# runs them at a quick size. About 25 minutes on 2 cores.
soak: $(STAMP) postgres
	$(BIN)/kubetune devcluster build
	$(BIN)/python -m compileall -q operator > /dev/null
	KUBETUNE_TEST_SIZE=full $(BIN)/python -m pytest tests/integration -q -ra -m soak --durations=10

unit: $(STAMP)
	$(BIN)/python -m pytest tests/unit -q

integration: $(STAMP) postgres chromium
	$(BIN)/python -m pytest tests/integration -q -ra

# the documentation site (MkDocs + Material) into site/; --strict: a warning (a broken
# link, a page missing from the nav) fails the build. The reference pages are generated
# from the sources as it builds (operator/kubetune/docgen).
docs: $(STAMP)
	$(BIN)/mkdocs build --strict

# the dashboard's store (10,000 trials x 100 results, ~430 MB) is built once by the first and reused by the others
bench: $(STAMP) bench-quality chromium
	$(BIN)/python -m kubetune.bench
	$(BIN)/python -m kubetune.bench.scale --out bench-results
	$(BIN)/python -m kubetune.bench.scale.get_trials > bench-results/get_trials.json
	$(BIN)/python -m kubetune.bench.scale.ledger > bench-results/ledger.json
	$(BIN)/python -m kubetune.bench.dashboard --repeats 3 --store sqlite:///$(CURDIR)/bench-results/dashboard.db \
		--out bench-results/dashboard.json
	$(BIN)/python -m kubetune.bench.dashboard_cpu --store sqlite:///$(CURDIR)/bench-results/dashboard.db \
		--out bench-results/dashboard_cpu.json
	$(BIN)/python -m kubetune.bench.dashboard_browser --store sqlite:///$(CURDIR)/bench-results/dashboard.db \
		--screenshots bench-results/dashboard-screenshots --out bench-results/dashboard_browser.json

# Search quality against Optuna, Syne Tune and random search on offline benchmarks (issue 28),
# 30 seeds: in a venv of its own, since mf-prior-bench pins numpy<2. About an hour on 2 cores.
BENCH_VENV := .venv-bench
QUALITY_REQUIREMENTS := operator/kubetune/bench/quality/requirements.txt
$(BENCH_VENV)/.installed-stamp: $(QUALITY_REQUIREMENTS) pyproject.toml
	test -x $(BENCH_VENV)/bin/python || $(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/pip install --quiet --upgrade pip
	$(BENCH_VENV)/bin/pip install --quiet -r $(QUALITY_REQUIREMENTS)
	$(BENCH_VENV)/bin/pip install --quiet --no-deps -e .
	touch $@

bench-quality: $(BENCH_VENV)/.installed-stamp
	$(BENCH_VENV)/bin/python -m kubetune.bench.quality --full

# kind + KubeRay + charts/kubetune + examples/kuberay; skipped (exit 0, with the
# reason) where no Docker engine runs; E2E_REQUIRED=1 turns the skip into a failure
e2e: $(STAMP)
	$(BIN)/python tests/e2e/kind_e2e.py

# PostgreSQL's server binaries: the results-store tests start a real server of their own
# (tests/integration/postgres_fixtures.py); Debian's package, installed once if missing
postgres:
	@if command -v pg_ctl >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql; \
	else \
		echo "make postgres: PostgreSQL's server is missing; install it (Debian/Ubuntu: sudo apt-get install postgresql)" >&2; \
		exit 1; \
	fi

# Chromium for the dashboard's browser tests (tests/integration/test_dashboard_browser.py,
# driven by Playwright with executable_path=/usr/bin/chromium: `playwright install` would
# download a browser of its own); Debian's package, installed once if missing
chromium:
	@if [ -x /usr/bin/chromium ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; \
	else \
		echo "make chromium: /usr/bin/chromium is missing; install it (Debian/Ubuntu: sudo apt-get install chromium); the browser tests skip without it" >&2; \
	fi

clean-venv:
	rm -rf $(VENV)
