# One entry point for people and CI. `make test` is what .ci/run and the README use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
BIN := $(VENV)/bin
PROTOS := $(wildcard protos/awp/v1/*.proto)
# buf comes as a binary inside this npm package; pinned so every machine lints alike.
BUF := npx --yes @bufbuild/buf@1.75.0
# The source roots, as pyproject.toml declares them (its one list).
ROOTS := $(shell $(PYTHON) -c 'import tomllib; print(" ".join(tomllib.load(open("pyproject.toml", "rb"))["tool"]["setuptools"]["packages"]["find"]["where"]))')
empty :=
space := $(empty) $(empty)

.PHONY: install proto proto-check buf-lint lint test test-pg15 test-fast demo cluster image-lock bench schema clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

install: $(VENV)/.installed

# Regenerates generated/ from protos/ (messages, gRPC stubs and .pyi types).
proto: $(VENV)/.installed
	rm -rf generated/awp
	$(PY) -m grpc_tools.protoc -I protos --python_out=generated --grpc_python_out=generated \
	  --plugin=protoc-gen-mypy=$(BIN)/protoc-gen-mypy --plugin=protoc-gen-mypy_grpc=$(BIN)/protoc-gen-mypy_grpc \
	  --mypy_out=generated --mypy_grpc_out=generated $(PROTOS)
	touch generated/awp/__init__.py generated/awp/v1/__init__.py

# Fails when the committed generated/ is not what protos/ produce.
proto-check: proto
	@git diff --exit-code --stat -- generated || (echo "generated/ drifted from protos/: run 'make proto' and commit" && exit 1)
	@test -z "$$(git status --porcelain -- generated)" || (echo "untracked files in generated/: run 'make proto' and commit" && git status --porcelain -- generated && exit 1)

# The protos against buf's STANDARD rules (protos/buf.yaml).
buf-lint:
	$(BUF) lint protos

lint: $(VENV)/.installed buf-lint
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	MYPYPATH=$(subst $(space),:,$(ROOTS)) $(BIN)/mypy $(filter-out generated,$(ROOTS))
	$(BIN)/lint-imports

test: lint proto-check
	$(BIN)/pytest
	$(MAKE) test-pg15

# The version matrix (docs/postgres.md): the storage, coordinator, server, control and
# pooler tests again, against Debian's PostgreSQL 15 (tests/kit/system_postgres.py) instead
# of the embedded 18. About two minutes on a loaded two-core machine.
PG15_TESTS := tests/db tests/coordinator tests/server tests/control tests/postgres \
  tests/fault/test_faults_pooler.py
test-pg15: $(VENV)/.installed
	env -u AWP_TEST_DATABASE_URL AWP_TEST_POSTGRES=system $(BIN)/pytest $(PG15_TESTS)

test-fast: $(VENV)/.installed
	$(BIN)/pytest -m "not fault" -x

demo: $(VENV)/.installed
	$(BIN)/awp demo

# The production topology as local processes (deploy/README.md): embedded PostgreSQL,
# 2 servers, 2 coordinators (leader + standby), 4 workers, on loopback; Ctrl-C stops all.
cluster: $(VENV)/.installed
	$(BIN)/awp dev --servers 2 --coordinators 2 --workers 4 --module awp_demo.workflow

# Rewrites deploy/image/requirements.lock: the image's exact dependency versions.
image-lock:
	PYTHON=$(PYTHON) sh deploy/image/install.sh lock

bench: $(VENV)/.installed
	$(PY) bench/bench.py
	$(PY) bench/publish.py

# Rewrites db/awp_db/schema.sql from a database migrated from empty (after a new migration).
schema: $(VENV)/.installed
	$(PY) -m awp_db.schema

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
