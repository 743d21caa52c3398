# Every target makes its own virtual environment in .venv; nothing but Python 3.11 is needed.
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
# Two sets share .venv, each with its own stamp (named after pyproject.toml's checksum):
# make serve installs the service alone; make test installs what the suite needs, which
# holds the service, so it writes both stamps and a later make serve installs nothing.
HASH := $(shell cksum < pyproject.toml | cut -d' ' -f1)
SERVE_STAMP := $(VENV)/.installed-serve-$(HASH)
TEST_STAMP := $(VENV)/.installed-test-$(HASH)

.PHONY: serve test bench lint clean images stack-test gpu-check

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# The service only: no torch, no test or benchmark tools.
$(SERVE_STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install -q -e '.[server]'
	rm -f $(VENV)/.installed-serve-* && touch $@

# torch's CPU build first, so that the test extra's torch>=2.4 does not bring a CUDA one.
$(TEST_STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test,bench]'
	$(BIN)/pip install -q -e examples/score_sampler
	rm -f $(VENV)/.installed-* && touch $(SERVE_STAMP) $@

serve: $(SERVE_STAMP)
	$(BIN)/rlreplay serve

# Two workers (pytest-xdist): much of the suite waits on servers and subprocesses. Each test
# file runs whole in one worker, so a module's server fixture starts once.
test: $(TEST_STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist loadfile

# The images, with BuildKit: rlreplay (the service, no torch) and rlreplay-sidecar. Where no
# registry answers, on a base made from Debian's packages (docker/build-base.sh); the
# machine's CA bundle and pip settings go in as build secrets. docs/deployment.md says more.
images:
	docker/build-images.sh server sidecar

# The compose stack for real (root, Docker; dockerd is started when none runs): builds the
# images, starts the service, the sidecar and an S3 server, freezes, kills and restores.
stack-test: $(TEST_STAMP)
	PYTHON=$(BIN)/python tests/deploy/stack-test.sh

# TorchRL's prioritized sampler needs its C++ extension, built for torch 2.14 in torchrl
# 0.14: the baseline runs in a venv of its own (bench/torchrl_baseline.py says why).
TORCHRL_VENV ?= .venv-torchrl

$(TORCHRL_VENV)/bin/python:
	$(PYTHON) -m venv $(TORCHRL_VENV)
	$(TORCHRL_VENV)/bin/pip install -q torch==2.14.1 torchrl==0.14.1 numpy

# Reverb (the client section's comparison) pins TensorFlow 2.15, so Python 3.11: its own venv.
REVERB_VENV ?= .venv-reverb

$(REVERB_VENV)/bin/python:
	python3.11 -m venv $(REVERB_VENV)
	$(REVERB_VENV)/bin/pip install -q dm-reverb==0.14.0 "tensorflow-cpu==2.15.*" numpy

bench: $(TEST_STAMP) $(TORCHRL_VENV)/bin/python $(REVERB_VENV)/bin/python
	@command -v wrk >/dev/null || echo "note: the HTTP section needs wrk (apt-get install wrk)"
	RLREPLAY_TORCHRL_PYTHON=$(TORCHRL_VENV)/bin/python \
	RLREPLAY_REVERB_PYTHON=$(REVERB_VENV)/bin/python $(BIN)/python -m bench $(BENCH_ARGS)

# The GPU path in one command, under 8 minutes on a machine with a CUDA torch in .venv: the
# CUDA tests, host-to-device bandwidth next to a pinned torch copy of the same bytes, the
# sidecar and bulk benchmarks (bench/gpu_check.py). Without a CUDA device it says so, exit 0.
gpu-check: $(TEST_STAMP)
	$(BIN)/python -m bench.gpu_check

# The design's checks a tool can make: lint-imports holds the layers one way (app's own, and
# between the top-level folders: gpu, clients|app, workers, wire); the two source walks
# fail on a write to a table's columns outside app/tables and on a placeholder base class
# (NotImplementedError outside an abstract method, a base calling into its subclass).
lint: $(TEST_STAMP)
	$(BIN)/ruff check rlreplay app workers wire clients gpu tests bench examples
	$(BIN)/ruff format --check rlreplay app workers wire clients gpu tests bench examples
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache
	$(BIN)/python -m pytest -q -p no:cacheprovider \
		tests/test_table_owns_writes.py tests/test_no_placeholder_bases.py

clean:
	rm -rf $(VENV) $(TORCHRL_VENV) .pytest_cache data
