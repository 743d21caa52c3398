# Every target makes its own virtual environment in .venv; nothing but Python 3.11 is needed.
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: serve test bench lint clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test,bench,torch]'
	$(BIN)/pip install -q -e examples/score_sampler
	rm -f $(VENV)/.installed-* && touch $(STAMP)

serve: $(STAMP)
	$(BIN)/rlreplay serve

test: $(STAMP)
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python -m bench

lint: $(STAMP)
	$(BIN)/ruff check app workers gpu clients tests bench
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .pytest_cache data
