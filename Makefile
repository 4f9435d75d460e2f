# The two commands a newcomer needs are `make run` and `make test`; `make help` lists the rest.
# Every target installs what it needs (Debian packages through apt-get), so a fresh machine works.

SHELL := /bin/bash
.DEFAULT_GOAL := help

SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# mold links the large DataFusion binaries several times faster than the default linker.
export RUSTFLAGS ?= -C link-arg=-fuse-ld=mold
export CARGO_TERM_COLOR ?= never
# A check builds from scratch on CI, where incremental compilation's caches only cost disk and time.
export CARGO_INCREMENTAL ?= 0

DATA_DIR ?= ./data
BIND ?= 127.0.0.1:8000
PG_TEST_DB ?= endpoints_test
PG_TEST_USER ?= endpoints_test
PG_URL_FILE ?= target/.test-postgres-url
SOAK_SECONDS ?= 180
FUZZ_CASES ?= 100000
FUZZ_SECONDS ?= 1800
BENCH_ROWS ?= 10000000
BENCH_COMPARE_ROWS ?= 2000000
VENV := target/venv
CARGO_DENY_VERSION ?= 0.20.2
DENY_CHECKS ?=
# `make lint` and `make test` check the build with the distributed engine (Apache DataFusion Ballista), so that
# every crate is compiled once, with one set of features: building a package alone (`-p`) or with other features
# resolves its dependencies' features differently and compiles most of the graph again, which on CI cost minutes
# and disk. The default build differs from it only by a few `cfg(not(feature = "ballista"))` lines.
BALLISTA := query-engine/ballista,server/ballista
CHECKED := --workspace --locked --features $(BALLISTA)

.PHONY: help
help: ## List the targets.
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-18s %s\n", $$1, $$2}'

.PHONY: deps
deps: ## Install the system packages the build needs (mold, libpq-dev, libssl-dev, pkg-config).
	@missing=""; \
	command -v mold >/dev/null || missing="$$missing mold"; \
	dpkg -s libpq-dev >/dev/null 2>&1 || missing="$$missing libpq-dev"; \
	dpkg -s libssl-dev >/dev/null 2>&1 || missing="$$missing libssl-dev"; \
	command -v pkg-config >/dev/null || missing="$$missing pkg-config"; \
	if [ -n "$$missing" ]; then \
	  echo "Installing:$$missing"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing >/dev/null; \
	fi

.PHONY: build
build: deps console ## Build the release binary (with the web console in it).
	cargo build --release --locked -p server

# The web console (console/): TypeScript and Svelte built by Vite into console/dist, which the binary embeds.
# Node is needed to build it, never to run it. It is rebuilt only when one of its sources changed, so that the
# binary, which embeds the files, is not relinked for nothing.
CONSOLE_SOURCES := $(shell find console/src -type f -not -name schema.d.ts 2>/dev/null) \
  $(addprefix console/,index.html package.json vite.config.ts tsconfig.json svelte.config.js)

.PHONY: node
node: ## Install Node.js and npm from Debian's packages if missing.
	@command -v node >/dev/null && command -v npm >/dev/null || { echo "Installing Node.js and npm"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq nodejs npm >/dev/null; }

console/node_modules/.package-lock.json: console/package-lock.json | node
	cd console && npm ci --no-audit --no-fund

console/dist/index.html: $(CONSOLE_SOURCES) console/node_modules/.package-lock.json
	cd console && npm run build

.PHONY: console
console: node console/dist/index.html ## Build the web console (type-checked against the API's own schema) into console/dist.

.PHONY: console-check
console-check: console $(VENV)/bin/python ## The console's unit tests (Vitest), then end to end in headless Chromium, and a run token used from a page of another origin (screenshots in target/console-screenshots/).
	cd console && npm test
	@command -v chromium >/dev/null || { echo "Installing Chromium"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq chromium >/dev/null; }
	@$(VENV)/bin/python -c 'import playwright' 2>/dev/null || $(VENV)/bin/pip install -q '$(PLAYWRIGHT)'
	@[ -x target/debug/endpoints ] || cargo build $(CHECKED) --bin endpoints
	@rm -rf target/console-screenshots
	ENDPOINTS_BIN=target/debug/endpoints $(VENV)/bin/python tests/console/console_e2e.py
	ENDPOINTS_BIN=target/debug/endpoints $(VENV)/bin/python tests/embed/embed_e2e.py

.PHONY: run
run: build ## Build, migrate, create the demo project and a key, print a curl line, and serve on $(BIND).
	./target/release/endpoints --data-dir $(DATA_DIR) migrate
	./target/release/endpoints --data-dir $(DATA_DIR) demo --base-url http://$(BIND)
	exec ./target/release/endpoints --data-dir $(DATA_DIR) serve --bind $(BIND)

.PHONY: postgres
postgres: ## Start a local PostgreSQL (installing it if missing) and create the throwaway test database.
	@command -v pg_lsclusters >/dev/null || { \
	  echo "Installing PostgreSQL"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq postgresql >/dev/null; }
	@read -r version name port status _ < <(pg_lsclusters -h | head -n 1); \
	if [ -z "$$version" ]; then \
	  version=$$(ls /usr/lib/postgresql | sort -V | tail -n 1); name=main; \
	  $(SUDO) pg_createcluster "$$version" "$$name" >/dev/null; \
	  read -r version name port status _ < <(pg_lsclusters -h | head -n 1); \
	fi; \
	if [ "$$status" != online ]; then \
	  $(SUDO) pg_ctlcluster --skip-systemctl-redirect "$$version" "$$name" start; \
	fi; \
	psql_su() { $(SUDO) su postgres -c "psql -p $$port -v ON_ERROR_STOP=1 -qAt -c \"$$1\""; }; \
	for i in $$(seq 1 30); do psql_su "SELECT 1" >/dev/null 2>&1 && break; sleep 1; done; \
	psql_su "SELECT 1 FROM pg_roles WHERE rolname = '$(PG_TEST_USER)'" | grep -q 1 || \
	  psql_su "CREATE ROLE $(PG_TEST_USER) LOGIN PASSWORD '$(PG_TEST_USER)'" >/dev/null; \
	psql_su "DROP DATABASE IF EXISTS $(PG_TEST_DB) WITH (FORCE)" >/dev/null; \
	psql_su "CREATE DATABASE $(PG_TEST_DB) OWNER $(PG_TEST_USER)" >/dev/null; \
	echo "postgres://$(PG_TEST_USER):$(PG_TEST_USER)@127.0.0.1:$$port/$(PG_TEST_DB)" > $(PG_URL_FILE); \
	echo "PostgreSQL $$version/$$name on port $$port: database $(PG_TEST_DB) is ready."

.PHONY: lint
lint: deps ## Format check, clippy with -D warnings, and the architecture's rules.
	cargo fmt --all --check
	rustfmt --edition 2021 --check tests/openapi/rust-client/src/main.rs
	cargo clippy $(CHECKED) --all-targets -- -D warnings
	@$(MAKE) --no-print-directory layers fail-closed
	@python3 tests/lint/import_cycles.py crates/*/src

# Outside tests a default is named where it is taken (`unwrap_or(SyncFrequency::DEFAULT)`, `unwrap_or("")`), so that
# a reader sees what an absent value becomes; clippy's `unwrap_used` refuses `.unwrap()` (Cargo.toml).
.PHONY: fail-closed
fail-closed: ## Refuse `unwrap_or_default()` outside tests.
	@hits=$$(for f in $$(git ls-files 'crates/*.rs' | grep -vE '(_tests|/tests|/testing|/properties)\.rs$$|/tests/'); do \
	  awk -v f="$$f" '/^#\[cfg\(test\)\]/ { exit } /unwrap_or_default\(\)/ { print f ":" NR ": " $$0 }' "$$f"; done); \
	if [ -n "$$hits" ]; then echo "$$hits"; echo "^ name the default (unwrap_or(...)) or state the invariant (expect)"; exit 1; fi; \
	echo "fail-closed: no unwrap_or_default() outside tests"

# The architecture's rules (tests/lint/architecture.py, docs/architecture.md): the crate graph from cargo metadata,
# the domain's parts in dependency order, the wall clock read only by the clock port, log records made only by the
# domain.
.PHONY: layers
layers: ## Check the crate graph, the order of the domain's parts, and who reads the clock and makes log records.
	@python3 tests/lint/architecture.py

.PHONY: test
test: deps console lint ## Everything CI checks: lint, then every test (SQLite, a local PostgreSQL, S3 on moto, Ballista, the console).
	@mkdir -p target
	@$(MAKE) --no-print-directory postgres moto
	@rm -rf target/openapi-samples
	TEST_POSTGRES_URL=$$(cat target/.test-postgres-url) TEST_MOTO_SERVER=$(CURDIR)/$(VENV)/bin/moto_server \
	  cargo test $(CHECKED)
	@echo "The domain embedded in another program, with in-memory adapters (crates/domain/examples/embedded.rs):"
	cargo run --locked -q -p domain --example embedded
	@echo "The engine's suite again, on a Ballista cluster (the same test binary, nothing compiled again):"
	@engine=$$(cargo test $(CHECKED) --lib --no-run 2>&1 | grep -o 'target/debug/deps/query_engine-[0-9a-f]*' | head -1); \
	[ -n "$$engine" ] || { echo "the engine's test binary was not found"; exit 1; }; \
	cd crates/query-engine && TEST_ENGINE=ballista $(CURDIR)/$$engine
	@$(MAKE) --no-print-directory openapi-check client-check ts-client-check rust-client-check formats-check delta-check mcp-check schemathesis-check console-check

OPENAPI_VALIDATOR := openapi-spec-validator==0.9.0
OPENAPI_CLIENT := openapi-python-client==0.29.1
DUCKDB := duckdb==2.0.0
SCHEMATHESIS := schemathesis==4.32.5
PYARROW := pyarrow==22.0.0
MOTO := moto[server]==5.2.5
PLAYWRIGHT := playwright==1.65.2
MCP := mcp==2.3.0
DELTALAKE := deltalake==1.6.6
ST_MAX_EXAMPLES ?= 10

$(VENV)/bin/python:
	@python3 -m venv $(VENV) 2>/dev/null || { $(SUDO) apt-get install -y -qq python3-venv >/dev/null && python3 -m venv $(VENV); }

.PHONY: pyarrow
pyarrow: $(VENV)/bin/python ## Install pyarrow, which the format and Delta checks and the benchmarks read Arrow and Parquet with.
	@$(VENV)/bin/python -c 'import pyarrow' 2>/dev/null || $(VENV)/bin/pip install -q '$(PYARROW)'

.PHONY: moto
moto: $(VENV)/bin/python ## Install moto's S3-compatible server, which the object storage tests start.
	@[ -x $(VENV)/bin/moto_server ] || $(VENV)/bin/pip install -q '$(MOTO)'

.PHONY: openapi-check
openapi-check: $(VENV)/bin/python ## Validate the OpenAPI documents the API tests saved, with a standard OpenAPI 3.0 validator.
	@[ -x $(VENV)/bin/openapi-spec-validator ] || $(VENV)/bin/pip install -q '$(OPENAPI_VALIDATOR)'

	@ls target/openapi-samples/*.json >/dev/null 2>&1 || { echo "no OpenAPI samples: run the API tests first"; exit 1; }
	@out=$$($(VENV)/bin/openapi-spec-validator target/openapi-samples/*.json 2>&1); status=$$?; \
	echo "$$out"; ok=$$(echo "$$out" | grep -c ': OK$$'); total=$$(ls target/openapi-samples/*.json | wc -l); \
	echo "openapi: $$ok passed, $$((total - ok)) failed"; exit $$status

.PHONY: client-check
client-check: $(VENV)/bin/python ## Generate a typed Python client from a live endpoint's OpenAPI document and use it.
	@[ -x $(VENV)/bin/openapi-python-client ] || $(VENV)/bin/pip install -q '$(OPENAPI_CLIENT)'
	@[ -x target/debug/endpoints ] || cargo build $(CHECKED) --bin endpoints
	ENDPOINTS_BIN=target/debug/endpoints $(VENV)/bin/python tests/openapi/client_e2e.py

.PHONY: ts-client-check
ts-client-check: $(VENV)/bin/python console/node_modules/.package-lock.json ## Generate TypeScript types of a live endpoint (openapi-typescript), call it through openapi-fetch, compile with strict tsc, run under Node.
	@[ -x target/debug/endpoints ] || cargo build $(CHECKED) --bin endpoints
	ENDPOINTS_BIN=target/debug/endpoints $(VENV)/bin/python tests/openapi/ts_client_check.py

.PHONY: rust-client-check
rust-client-check: $(VENV)/bin/python ## Generate a Rust client of a live endpoint with progenitor's generate_api! (tests/openapi/rust-client, its own lock file), build it and run it.
	@[ -x target/debug/endpoints ] || cargo build $(CHECKED) --bin endpoints
	ENDPOINTS_BIN=target/debug/endpoints $(VENV)/bin/python tests/openapi/rust_client_check.py

.PHONY: formats-check
formats-check: pyarrow ## Read a run back as CSV, NDJSON, Parquet and Arrow (Python's csv, pyarrow) and compare with its JSON.
	@[ -x target/debug/endpoints ] || cargo build $(CHECKED) --bin endpoints
	ENDPOINTS_BIN=target/debug/endpoints $(VENV)/bin/python tests/openapi/formats_check.py

.PHONY: delta-check
delta-check: pyarrow ## Every table the API wrote (appended, compacted, quarantined, replaced) read by the `deltalake` Python package: the rows a run returns.
	@$(VENV)/bin/python -c 'import deltalake' 2>/dev/null || $(VENV)/bin/pip install -q '$(DELTALAKE)'
	@[ -x target/debug/endpoints ] || cargo build $(CHECKED) --bin endpoints
	ENDPOINTS_BIN=target/debug/endpoints $(VENV)/bin/python tests/openapi/delta_check.py

.PHONY: mcp-check
mcp-check: $(VENV)/bin/python ## `/mcp` with the official MCP Python SDK as the client: tools listed and called with keys and a run token.
	@$(VENV)/bin/python -c 'import mcp' 2>/dev/null || $(VENV)/bin/pip install -q '$(MCP)'
	@[ -x target/debug/endpoints ] || cargo build $(CHECKED) --bin endpoints
	ENDPOINTS_BIN=target/debug/endpoints $(VENV)/bin/python tests/mcp/mcp_check.py

.PHONY: schemathesis-check
schemathesis-check: $(VENV)/bin/python ## schemathesis over /api/schema on a live server: every operation, both families (ST_MAX_EXAMPLES=10).
	@[ -x $(VENV)/bin/st ] || $(VENV)/bin/pip install -q '$(SCHEMATHESIS)'
	@[ -x target/debug/endpoints ] || cargo build $(CHECKED) --bin endpoints
	ENDPOINTS_BIN=target/debug/endpoints ST_MAX_EXAMPLES=$(ST_MAX_EXAMPLES) $(VENV)/bin/python tests/openapi/schemathesis_check.py

# What the benchmarks drive the server with and measure it against: wrk, and DuckDB and pyarrow in the virtualenv.
.PHONY: bench-tools
bench-tools: pyarrow
	@command -v wrk >/dev/null || { echo "Installing wrk"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq wrk >/dev/null; }
	@$(VENV)/bin/python -c 'import duckdb, sys; sys.exit("duckdb==" + duckdb.__version__ != "$(DUCKDB)")' 2>/dev/null || \
	  $(VENV)/bin/pip install -q '$(DUCKDB)'

.PHONY: bench
bench: deps bench-tools ## Benchmarks against baselines (release, BENCH_ROWS=10000000 events) into docs/benchmarks.md.
	@mkdir -p target
	@$(MAKE) --no-print-directory postgres PG_TEST_DB=endpoints_bench PG_URL_FILE=target/.bench-postgres-url
	cargo build --release --locked -p server --features bench,ballista --bins
	$(VENV)/bin/python tests/bench/bench.py --rows $(BENCH_ROWS) --postgres-url "$$(cat target/.bench-postgres-url)" \
	  --duckdb-python $(VENV)/bin/python

# The earlier build of `make bench-compare`: a worktree at BASE, built into its own target directory (cold the first
# time, about 30 minutes here; later bases rebuild only what changed).
BASE_TREE := target/bench-base
BASE_TARGET := $(CURDIR)/target/bench-base-target
.PHONY: bench-base
bench-base: deps bench-tools
	@test -n "$(BASE)" || { echo "usage: make $(firstword $(MAKECMDGOALS)) BASE=<commit>" >&2; exit 2; }
	@git worktree remove --force $(BASE_TREE) 2>/dev/null || true
	@git worktree prune
	git worktree add --detach $(BASE_TREE) "$(BASE)"
	cd $(BASE_TREE) && CARGO_TARGET_DIR=$(BASE_TARGET) cargo build --release --locked -p server --bin endpoints
	git worktree remove --force $(BASE_TREE)
	cargo build --release --locked -p server --bin endpoints

.PHONY: bench-compare
bench-compare: bench-base ## This build against BASE=<commit> (built in a worktree), run beside it: scenario 13's shapes, a cached run and the server's memory (BENCH_COMPARE_ROWS=2000000), into docs/benchmark-beside.md.
	$(VENV)/bin/python tests/bench/bench.py --only compare --rows $(BENCH_COMPARE_ROWS) \
	  --before-bin-dir $(BASE_TARGET)/release --before-label "$$(git rev-parse --short "$(BASE)")"

.PHONY: bench-beside
bench-beside: bench-base ## Scenarios 1-5, 8 and 10-12 on BASE=<commit> and then on this build, their headline figures side by side (BENCH_COMPARE_ROWS events), into docs/benchmark-beside.md.
	$(VENV)/bin/python tests/bench/bench.py --only beside --rows $(BENCH_COMPARE_ROWS) --duckdb-python $(VENV)/bin/python \
	  --before-bin-dir $(BASE_TARGET)/release --before-label "$$(git rev-parse --short "$(BASE)")"

.PHONY: bench-isolation
bench-isolation: deps bench-tools ## Scenario 9 of make bench alone (fairness between projects, a flood of unknown keys) into docs/benchmark-scenarios.md.
	@mkdir -p target
	cargo build --release --locked -p server --features bench,ballista --bins
	python3 tests/bench/bench.py --only isolation

.PHONY: bench-appends
bench-appends: deps bench-tools ## Scenario 10 of make bench alone (streaming appends, compaction) into docs/benchmark-scenarios.md.
	@mkdir -p target
	cargo build --release --locked -p server --features bench,ballista --bins
	$(VENV)/bin/python tests/bench/bench.py --only appends --duckdb-python $(VENV)/bin/python

.PHONY: bench-nodes
bench-nodes: deps bench-tools ## Scenario 6 of make bench alone (1-3 nodes on PostgreSQL; BEFORE=dir measures a previous build beside) into docs/benchmark-scenarios.md.
	@mkdir -p target
	@$(MAKE) --no-print-directory postgres PG_TEST_DB=endpoints_bench PG_URL_FILE=target/.bench-postgres-url
	@$(MAKE) --no-print-directory postgres PG_TEST_DB=endpoints_bench_before PG_URL_FILE=target/.bench-before-postgres-url
	cargo build --release --locked -p server --features bench,ballista --bins
	$(VENV)/bin/python tests/bench/bench.py --only nodes --postgres-url "$$(cat target/.bench-postgres-url)" \
	  $(if $(BEFORE),--before-bin-dir $(BEFORE) --before-postgres-url "$$(cat target/.bench-before-postgres-url)")

.PHONY: bench-commits
bench-commits: deps bench-tools ## Scenario 14 of make bench alone (a new process's first run over a table of 100,000 commits) into docs/benchmark-scenarios.md.
	@mkdir -p target
	cargo build --release --locked -p server --features bench,ballista --bins
	python3 tests/bench/bench.py --only commits

.PHONY: bench-logs
bench-logs: deps bench-tools ## Scenario 12 of make bench alone (cached runs with the run log on and off, usage over a million records) into docs/benchmark-scenarios.md.
	@mkdir -p target
	cargo build --release --locked -p server --features bench,ballista --bins
	python3 tests/bench/bench.py --only logs --rows $(BENCH_ROWS)

.PHONY: bench-fresh
bench-fresh: deps bench-tools ## Scenario 11 of make bench alone (folds against full refreshes, materialized runs while rows stream in; BENCH_ROWS events) into docs/benchmark-scenarios.md.
	@mkdir -p target
	cargo build --release --locked -p server --features bench,ballista --bins
	python3 tests/bench/bench.py --only fresh --rows $(BENCH_ROWS)

.PHONY: bench-shapes
bench-shapes: deps bench-tools ## Scenario 13 of make bench alone (a mix of query shapes against DuckDB at BENCH_ROWS/10 and BENCH_ROWS events) into docs/benchmark-scenarios.md.
	@mkdir -p target
	cargo build --release --locked -p server --features bench,ballista --bins
	$(VENV)/bin/python tests/bench/bench.py --only shapes --rows $(BENCH_ROWS) --duckdb-python $(VENV)/bin/python

.PHONY: soak
soak: deps ## Mixed workload against one server on PostgreSQL (SOAK_SECONDS=180), checked at the end, into docs/soak.md.
	@mkdir -p target
	@$(MAKE) --no-print-directory postgres PG_TEST_DB=endpoints_soak PG_URL_FILE=target/.soak-postgres-url
	cargo build --release --locked -p server --bin endpoints
	python3 tests/soak/soak.py --bin-dir target/release --postgres-url "$$(cat target/.soak-postgres-url)" \
	  --seconds $(SOAK_SECONDS)

.PHONY: fuzz
fuzz: deps ## Property tests of the parsers of client input with FUZZ_CASES cases each (make test runs 256).
	PROPTEST_CASES=$(FUZZ_CASES) timeout $(FUZZ_SECONDS) cargo test --locked -p domain -p query-engine properties

.PHONY: audit
audit: deps ## cargo deny check against deny.toml (DENY_CHECKS="licenses bans sources" skips the advisories fetched from github.com).
	@[ -x target/tools/bin/cargo-deny ] || cargo install --locked --root target/tools cargo-deny --version $(CARGO_DENY_VERSION)
	target/tools/bin/cargo-deny check $(DENY_CHECKS)

.PHONY: fmt
fmt: ## Format the code.
	cargo fmt --all
