# Every target does its own set-up: a fresh Debian/Ubuntu clone needs only `make serve` or `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# Never a password prompt (an MCP host runs `make serve` with no terminal): sudo -n fails at
# once when it would ask, and the target then prints the command to run.
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo -n)

.PHONY: setup system-deps test-deps replica-deps gateways serve serve-http test test-user test-e2e test-fast bench lint doctor demo clean

setup: system-deps replica-deps $(VENV)/.installed

# bubblewrap is the kernel sandbox; without it kernels refuse to start (the rest still works).
system-deps:
	@command -v bwrap >/dev/null 2>&1 || { \
	  echo "bubblewrap (the kernel sandbox) is missing: trying $(SUDO) apt-get install bubblewrap" >&2; \
	  $(SUDO) apt-get install -y bubblewrap >/dev/null 2>&1 || \
	  { $(SUDO) apt-get update >/dev/null 2>&1 && $(SUDO) apt-get install -y bubblewrap >/dev/null 2>&1; } || \
	  echo "dataref: bubblewrap is not installed, so run_python cannot start kernels. Install it" \
	    "with: sudo apt-get install bubblewrap (Debian/Ubuntu) or sudo dnf install bubblewrap" \
	    "(Fedora), then restart the server. \`make doctor\` checks the rest." >&2; }

# PostgreSQL: the tests start a real server (initdb/pg_ctl in a temp dir) for the SQL sources.
test-deps:
	@ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1 || { \
	  echo "installing postgresql (the tests' database server)"; \
	  $(SUDO) apt-get install -y postgresql >/dev/null 2>&1 || \
	  { $(SUDO) apt-get update >/dev/null && $(SUDO) apt-get install -y postgresql; }; }

# PostgreSQL (shared state) and HAProxy (load balancer) for the replica tests and benchmarks;
# a single-process install needs neither.
replica-deps:
	@{ ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1 && [ -x /usr/sbin/haproxy ]; } || { \
	  echo "installing postgresql and haproxy (replica tests)"; \
	  $(SUDO) apt-get install -y postgresql haproxy >/dev/null 2>&1 || \
	  { $(SUDO) apt-get update >/dev/null && $(SUDO) apt-get install -y postgresql haproxy; }; }

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $@

serve: setup  ## the MCP server over stdio on the demo source (what MCP hosts launch)
	@echo "dataref: serving MCP over stdio (Ctrl-C to stop); see README for host configs" >&2
	$(VENV)/bin/dataref serve

serve-http: setup  ## streamable HTTP on 127.0.0.1:8000/mcp; needs [auth] tokens in the config
	$(VENV)/bin/dataref serve --http

# Jupyter Kernel Gateway and Enterprise Gateway, each in a venv of its own under .gateways/:
# the kernel tests run on them too (and fail without them).
gateways: setup
	bash tests/gateways/setup.sh

test: setup test-deps gateways  ## the whole test suite
	$(PY) -m pytest -q

# As root: creates an ordinary account with a copy of this checkout and a venv it owns, and runs
# the compute and sandbox tests as that account (userns mode; `make test` covers uid mode).
test-user: system-deps  ## the compute and sandbox tests as an ordinary account (user namespaces)
	bash tests/usermode/run.sh -q -k "not kg and not eg" tests/usermode tests/test_sandbox.py tests/test_kernels.py \
	  tests/test_compute.py tests/test_server.py tests/test_demo_command.py \
	  tests/test_faults.py::test_a_kernel_killed_from_outside_fails_the_call_promptly_and_the_next_call_works

# Node 22, the MCP Inspector, the conformance suite, playwright-core (into .node/) and
# Debian's chromium are installed by tests/e2e/setup.sh; the tests fail (not skip) without them.
test-e2e: setup  ## real clients: MCP Inspector CLI, MCP conformance suite, JupyterLab and the page in Chromium
	bash tests/e2e/setup.sh
	$(PY) -m pytest -q tests/e2e

bench: setup test-deps gateways  ## benchmarks against the seed-style baseline and the naive pattern
	$(PY) -m tests.benchmarks
	$(PY) -m tests.benchmarks.gateways
	$(PY) -m tests.benchmarks.replicas  # 1/2/3 replicas behind HAProxy -> results/replicas.md

demo: setup  ## the article's session through a real MCP client
	$(VENV)/bin/dataref demo

doctor: setup
	$(VENV)/bin/dataref doctor

lint: setup
	$(VENV)/bin/ruff check server tests
	$(VENV)/bin/ruff format --check server tests

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache test-output .node .gateways
