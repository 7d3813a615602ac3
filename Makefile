# One entry point for people and CI. `make run` and `make test` create .venv on their own.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PROTOS := $(wildcard proto/sessionlog/v1/*.proto)
SERVICE_PROTOS := $(wildcard proto/sessionlog/v1/*_service.proto)
TS := client/typescript
TS_MODULES := $(TS)/node_modules/.package-lock.json

.PHONY: run cluster test test-workers try-latest browser go-tools etcd-tools haproxy-tools check test-fast lint format gen gen-client gen-go gen-ts gen-api-docs gen-check gen-docs ts-build ts-lint bench bench-tools clean docs dist

# The venv's packages are installed by uv (PyPI), which resolves the same versions pip does
# from the same pyproject.toml files but downloads and unpacks them in parallel: the dev install
# took 177 s with pip and 19 s with uv on a busy 2-core machine (a fresh clone, empty caches).
# uv reads UV_INDEX_URL / UV_EXTRA_INDEX_URL, not pip's settings, for a private index.
UV_INSTALL = $(BIN)/uv pip install -q --python $(BIN)/python

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(BIN)/uv: | $(BIN)/python
	$(BIN)/pip install -q 'uv>=0.9,<0.14'
	$(UV_INSTALL) --upgrade pip

$(VENV)/.run-stamp: pyproject.toml client/python/pyproject.toml | $(BIN)/uv
	$(UV_INSTALL) -e client/python -e .
	touch $@

$(VENV)/.dev-stamp: pyproject.toml client/python/pyproject.toml | $(BIN)/uv
	$(UV_INSTALL) -e client/python -e '.[dev]'
	touch $@ $(VENV)/.run-stamp

## run: start the server on ./sessionlog-data, listening on 127.0.0.1:50051
run: $(VENV)/.run-stamp
	$(BIN)/sessionlog serve

## cluster: etcd, two three-member groups (--cluster, --ack replica, --shard-map etcd) and HAProxy
## in front on 127.0.0.1:50050, until Ctrl-C (`sessionlog dev cluster --groups 2`; folders and
## logs in ./sessionlog-cluster)
cluster: $(VENV)/.run-stamp etcd-tools haproxy-tools
	$(BIN)/sessionlog dev cluster --groups 2

## test: install everything and run the whole suite in two phases, then the e2e tests marked
## `workers` again against --workers 2 servers (`make test-workers`, the same two phases). Phase
## one: every test not marked `serial`, in TEST_PROCESSES test processes (pytest-xdist,
## --dist loadgroup: a module's tests in one of them, tests/_groups.py groups them). Phase two:
## the tests marked `serial` (they assert elapsed time, heartbeat rates or a fixed budget, or
## measure: the rule is in tests/conftest.py), in one process with nothing else running. Each
## phase ends with its 25 slowest tests. TEST_PROCESSES=0 runs phase one in one process too.
## Measured on a 2-core machine: the default pass took 1,845 s in one process (2,459 tests) and
## 1,174 s in 4 (-n 4), where a few timing-bound tests failed under the load: they are `serial` now
## (40 tests; the longest the 30-fault failover run, about 111 s, and the Node client's suites).
## Under a load average of 10-12 (other jobs on the machine, far above a CI run's): tests/cluster
## not serial in 3 processes, 107 tests in 236 s (one failure, on a 1 s etcd call: now serial);
## its serial tests alone 57 s; five follow/feed/client e2e modules' not-serial tests, 63 s.
TEST_PROCESSES ?= 3
PYTEST_PARALLEL = -n $(TEST_PROCESSES) --dist loadgroup
# pytest's exit status 5 is "no test selected": a phase with nothing to run passes.
PYTEST_PHASE = status=0; $(BIN)/python -m pytest --durations=25 $(1) || status=$$?; \
	[ $$status = 0 ] || [ $$status = 5 ] || exit $$status
# Bytecode: this machine kind's environment sets PYTHONDONTWRITEBYTECODE=1, so every Python
# process of a run (test processes, servers, CLI calls, workers) compiled the project's modules
# from source again, and each test process rewrote and compiled every test module. The tests
# keep bytecode in .venv/pycache (out of the tree). Measured on a busy 2-core machine: a
# collection of the suite 20.9 -> 11.5 s CPU, importing the CLI and the server 0.9 -> 0.6 s.
test test-workers test-fast: export PYTHONDONTWRITEBYTECODE :=
test test-workers test-fast: export PYTHONPYCACHEPREFIX := $(abspath $(VENV))/pycache
test: $(VENV)/.dev-stamp browser go-tools etcd-tools haproxy-tools bench-tools
	$(call PYTEST_PHASE,-m "not serial" $(PYTEST_PARALLEL))
	$(call PYTEST_PHASE,-m serial)
	$(MAKE) --no-print-directory test-workers

## test-fast: the unit and integration tests only (a few minutes; no servers of other kinds, no
## browser, no apt-get): what to run to check a checkout. One phase: none of them is `serial`.
test-fast: $(VENV)/.dev-stamp
	$(BIN)/python -m pytest tests/unit tests/integration -q $(PYTEST_PARALLEL)

## test-workers: the e2e tests marked `workers` against `sessionlog serve --workers 2` processes.
## The rule: a module (`pytestmark`) or a test is marked when what it checks crosses worker
## processes: the core semantics and leases (test_rpcs, test_lease), the wakeups of follow,
## FollowSessions and the change feed, what every worker must apply of the settings (tokens on
## every RPC, TLS), metrics summed over workers, the log, signals and crashes of a server of
## several processes. Every other e2e test runs code that is the same in whichever worker takes
## the call, and runs once, in the default pass; test_workers*.py and test_metrics_workers.py
## start their own multi-process servers in either mode, so they too run once. The tests marked
## in_process, which reach inside a server in the test's own process, are deselected here.
test-workers: $(VENV)/.dev-stamp browser go-tools etcd-tools haproxy-tools
	$(call PYTEST_PHASE,tests/e2e --workers 2 -m "workers and not serial" $(PYTEST_PARALLEL))
	$(call PYTEST_PHASE,tests/e2e --workers 2 -m "workers and serial")

## try-latest: the framework tests against the newest releases of the frameworks (and of the
## packages the tests import from them), and the suite's grouping against the newest pytest and
## pytest-xdist, in a throw-away venv (.venv-latest): prints the versions
## installed beside the ranges the client's extras and the dev extra pin, then what broke. Not
## part of `make check`: run it to learn whether a range can be raised.
FRAMEWORKS := openai-agents openai pydantic-ai-slim google-adk google-genai claude-agent-sdk \
	langgraph langgraph-checkpoint langchain-core agent-framework-core pytest pytest-xdist
FRAMEWORK_TESTS := tests/e2e/test_openai_agents_session.py tests/e2e/test_pydantic_ai_history.py \
	tests/e2e/test_google_adk_sessions.py tests/unit/test_framework_items.py \
	tests/unit/test_google_adk_mapping.py tests/e2e/test_claude_agent_sdk_store.py \
	tests/unit/test_claude_agent_sdk_mapping.py tests/e2e/test_langgraph_checkpoint.py \
	tests/e2e/test_langchain_history.py tests/e2e/test_agent_framework_history.py \
	tests/unit/test_test_groups.py
try-latest:
	rm -rf .venv-latest
	$(PYTHON) -m venv .venv-latest
	.venv-latest/bin/pip install -q --upgrade pip
	.venv-latest/bin/pip install -q -e client/python -e '.[dev]'
	@# Past the pinned ranges on purpose: pip warns about the conflict and installs the newest.
	.venv-latest/bin/pip install -q --upgrade $(FRAMEWORKS) 2>&1 | grep -v "^ERROR: pip's dependency resolver\|^sessionlog-client" || true
	@echo "newest releases installed (pinned ranges: client/python/pyproject.toml, pyproject.toml dev):"
	@.venv-latest/bin/pip list 2>/dev/null | grep -i -E "^($$(echo $(FRAMEWORKS) | tr ' ' '|')) "
	@.venv-latest/bin/python -m pytest $(FRAMEWORK_TESTS) -q -p no:cacheprovider -rfE; \
	status=$$?; \
	if [ $$status = 0 ]; then echo "try-latest: the framework tests pass on the newest releases"; \
	else echo "try-latest: the failures above are what the newest releases broke"; fi; \
	exit $$status

## browser: Debian's chromium + chromium-driver for the web console test, and nghttp2-client
## (h2load) for tests/e2e/test_bench.py (apt-get, as root)
browser:
	@if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1 && command -v h2load >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing chromium, chromium-driver and nghttp2-client (for tests/e2e/test_web_console.py and test_bench.py)"; \
	  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver nghttp2-client; \
	else \
	  echo "make test needs chromium, chromium-driver and nghttp2-client: run it as root on Debian, or first run" >&2; \
	  echo "  sudo apt-get install -y chromium chromium-driver nghttp2-client" >&2; \
	  exit 1; \
	fi

## go-tools: Debian's Go 1.19 and the Go packages tests/e2e/test_client_go.py builds client/go
## with, offline in GOPATH mode (apt-get, as root). golang-github-golang-protobuf-1-5-dev replaces
## Debian's default 1-3, with which the stubs panic in table_marshal.go.
GO_DEBS := golang-go golang-google-grpc-dev golang-google-protobuf-dev golang-github-golang-protobuf-1-5-dev
go-tools:
	@missing=""; for deb in $(GO_DEBS); do \
	  dpkg-query -W -f='$${Status}' $$deb 2>/dev/null | grep -q 'install ok installed' || missing="$$missing $$deb"; \
	done; \
	if [ -z "$$missing" ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing$$missing (for tests/e2e/test_client_go.py)"; \
	  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing; \
	else \
	  echo "make test needs$$missing: run it as root on Debian, or first run" >&2; \
	  echo "  sudo apt-get install -y$$missing" >&2; \
	  exit 1; \
	fi

## etcd-tools: Debian's etcd-server (3.4) for the election tests in tests/cluster and the etcd
## rows of tests/e2e/test_bench.py (apt-get, as root)
etcd-tools:
	@if command -v etcd >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing etcd-server (for tests/cluster and tests/e2e/test_bench.py)"; \
	  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q etcd-server; \
	else \
	  echo "make test needs etcd-server: run it as root on Debian, or first run" >&2; \
	  echo "  sudo apt-get install -y etcd-server" >&2; \
	  exit 1; \
	fi

## haproxy-tools: Debian's haproxy (2.6) for tests/cluster/test_haproxy.py and the check of
## deploy/haproxy.cfg in tests/unit/test_haproxy.py (apt-get, as root)
haproxy-tools:
	@if command -v haproxy >/dev/null 2>&1 || [ -x /usr/sbin/haproxy ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing haproxy (for tests/cluster/test_haproxy.py and tests/unit/test_haproxy.py)"; \
	  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q haproxy; \
	else \
	  echo "make test needs haproxy: run it as root on Debian, or first run" >&2; \
	  echo "  sudo apt-get install -y haproxy" >&2; \
	  exit 1; \
	fi

## check: formatting, lint, types, proto lint, generated code up to date, the docs site, then
## the tests
check: lint gen-check docs test

lint: $(VENV)/.dev-stamp
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/buf lint
	$(BIN)/buf format --diff --exit-code
	$(MAKE) --no-print-directory ts-lint

## The Node client's npm dependencies (typescript among them), installed when the lock changes
$(TS_MODULES): $(TS)/package-lock.json
	cd $(TS) && npm ci --no-audit --no-fund --loglevel=error
	touch $@

## ts-build: compile the TypeScript client, client/typescript/src/*.ts -> lib/ (JS and .d.ts,
## tsc --strict); the node tests, `npm test`, `npm pack` and `make dist` build it first
ts-build: $(TS_MODULES)
	cd $(TS) && npm run --silent build

## ts-lint: the build (tsc --strict on the sources), then tsc --strict (no emit) on test/types.ts,
## a typed program written against the built declarations (tsconfig.types.json: not `tsc -p .`,
## which checks the sources again and parses the SDKs' declarations again, 20 s more on a busy
## 2-core machine; tests/e2e/test_client_typescript.py runs that one)
ts-lint: ts-build
	cd $(TS) && node node_modules/typescript/bin/tsc -p tsconfig.types.json

format: $(VENV)/.dev-stamp
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .
	$(BIN)/buf format -w

## gen: regenerate server/sessionlog/v1, the Python client's derived files and the API reference
## (docs/reference/api.md) from proto/
gen: $(VENV)/.dev-stamp
	rm -f server/sessionlog/v1/*_pb2*.py server/sessionlog/v1/*_pb2.pyi
	$(BIN)/python -m grpc_tools.protoc -Iproto --python_out=server --pyi_out=server $(PROTOS)
	$(BIN)/python -m grpc_tools.protoc -Iproto --grpc_python_out=server $(SERVICE_PROTOS)
	$(MAKE) gen-client
	$(MAKE) gen-ts
	$(MAKE) gen-api-docs

## gen-client: regenerate client/python/sessionlog_client/{v1,errors.py} and _sync.py (from _aio.py)
## (see client/python/gen.py)
gen-client: $(VENV)/.dev-stamp
	$(BIN)/python client/python/gen.py

## gen-api-docs: write docs/reference/api.md from the proto files' comments and the error table
## (server/sessionlog/errors.py; see tools/api_docs.py)
gen-api-docs: $(VENV)/.dev-stamp
	$(BIN)/python tools/api_docs.py

## gen-ts: regenerate client/typescript/src/proto.ts, the TypeScript shapes of the messages as
## the Node client reads them (scripts/gen-proto-types.mjs, protobufjs on proto/)
gen-ts: $(TS_MODULES)
	cd $(TS) && node scripts/gen-proto-types.mjs

## gen-go: regenerate the Go stubs in client/go (needs protoc-gen-go and protoc-gen-go-grpc on
## PATH: apt-get install protoc-gen-go protoc-gen-go-grpc)
gen-go: $(VENV)/.dev-stamp
	$(BIN)/buf generate --template buf.gen.yaml

## gen-check: fail when the generated code is stale
gen-check: $(VENV)/.dev-stamp $(TS_MODULES)
	@tmp=$$(mktemp -d) && \
	$(BIN)/python -m grpc_tools.protoc -Iproto --python_out=$$tmp --pyi_out=$$tmp $(PROTOS) && \
	$(BIN)/python -m grpc_tools.protoc -Iproto --grpc_python_out=$$tmp $(SERVICE_PROTOS) && \
	for f in $$tmp/sessionlog/v1/*; do \
	  cmp -s $$f server/sessionlog/v1/$$(basename $$f) || { echo "stale: server/sessionlog/v1/$$(basename $$f); run make gen"; exit 1; }; \
	done; \
	extra=$$(cd server/sessionlog/v1 && ls *_pb2*.py* | while read f; do [ -e $$tmp/sessionlog/v1/$$f ] || echo $$f; done); \
	[ -z "$$extra" ] || { echo "not generated from proto/: $$extra"; exit 1; }; \
	rm -rf $$tmp; echo "generated code is up to date"
	@$(BIN)/python client/python/gen.py --check
	@$(BIN)/python tools/api_docs.py --check
	@$(BIN)/python -m sessionlog.config --check-table $(SETTINGS_PAGE)
	@cd $(TS) && node scripts/gen-proto-types.mjs --check

## bench: run the benchmarks and print the table
bench: $(VENV)/.dev-stamp bench-tools
	$(BIN)/python -m bench

## bench-tools: Debian's redis-server (the Redis peer), etcd-server (the etcd peer),
## nghttp2-client (h2load, the compiled load client), haproxy (case 10, in front of two
## groups), postgresql (case 12's Postgres peer) and Debian's Go packages (case 13's
## bench/go/appendload, built offline: see go-tools) when missing (apt-get, as root); otherwise
## a note, and the bench skips their rows
bench-tools:
	@missing=""; \
	for deb in $(GO_DEBS); do \
	  dpkg-query -W -f='$${Status}' $$deb 2>/dev/null | grep -q 'install ok installed' || missing="$$missing $$deb"; \
	done; \
	command -v redis-server >/dev/null 2>&1 || missing="$$missing redis-server"; \
	command -v etcd >/dev/null 2>&1 || missing="$$missing etcd-server"; \
	command -v h2load >/dev/null 2>&1 || missing="$$missing nghttp2-client"; \
	command -v haproxy >/dev/null 2>&1 || [ -x /usr/sbin/haproxy ] || missing="$$missing haproxy"; \
	command -v initdb >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing="$$missing postgresql"; \
	if [ -z "$$missing" ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing$$missing (for make bench)"; \
	  { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing; } || \
	    echo "note: apt-get could not install$$missing; make bench skips the rows that need it" >&2; \
	else \
	  echo "note: make bench skips the rows that need$$missing; to have them, run as root:" >&2; \
	  echo "  apt-get install -y$$missing" >&2; \
	fi

## dist: the release artefacts in dist/, built from this checkout: the server's and the Python
## client's wheels (always installed together, `pip install dist/*.whl`) and the Node client's
## tarball (`npm pack` in client/typescript, which compiles src/ to lib/ first; `npm install
## dist/sessionlog-client-0.1.0.tgz`)
dist: $(TS_MODULES) | $(BIN)/uv
	rm -rf dist
	$(UV_INSTALL) 'setuptools>=77'
	$(BIN)/pip wheel -q --no-deps --no-build-isolation --wheel-dir dist ./client/python .
	cd client/typescript && npm pack --silent --pack-destination ../../dist >/dev/null
	@ls dist

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

## gen-docs: rewrite the settings table of the configuration page from server/sessionlog/config.py
SETTINGS_PAGE := docs/reference/configuration.md
gen-docs: $(VENV)/.dev-stamp
	$(BIN)/python -m sessionlog.config --write-table $(SETTINGS_PAGE)

## docs: the documentation site from docs/ into site/ (mkdocs build --strict: every nav page
## exists, every internal link and anchor resolves), after gen-docs
docs: gen-docs
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict
