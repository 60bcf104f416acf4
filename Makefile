# Set-up and checks for a fresh machine. Everything installs into $(VENV).
VENV ?= .venv
PY := $(VENV)/bin/python
# every install pinned by constraints.txt (also inside pip's isolated build environment)
PIP := PIP_CONSTRAINT=$(CURDIR)/constraints.txt $(PY) -m pip
TEST_EXTRAS ?= dev,bench,service,strings,text,cluster,langchain,llamaindex

.PHONY: demo test test-deps lint docs bench-smoke clean constraints

$(PY):
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip

demo: $(PY)
	$(PIP) install -q -e ".[bench,strings]"
	$(VENV)/bin/simsearch demo

# the suite runs on every core (pytest-xdist), a test file to a worker: a file's module-scoped
# nodes and clusters are made once; the files in collection order, which puts the longest first
# (tests/conftest.py, LONG_FIRST); TEST_WORKERS=0 runs it in this process alone
TEST_WORKERS ?= auto

# what make test and make lint need, installed again only when the pins, the package's metadata
# or its C++ sources change (pip install -e rebuilds the extension every time: 16 s).
# --no-compile: Python compiles what the suite imports as it imports it (make test), not all
# 1.9 GB of site-packages at install (40 s of a fresh install's 83 here)
DEPS := $(VENV)/.deps-$(TEST_EXTRAS)
test-deps: $(DEPS)
$(DEPS): pyproject.toml constraints.txt $(wildcard csrc/*) | $(PY)
	$(PIP) install -q --no-compile -e ".[$(TEST_EXTRAS)]"
	touch $@

# the static checks are make lint's (CI runs both). Bytecode cached even where the environment
# says not to (PYTHONDONTWRITEBYTECODE, set on this machine and its CI): the suite starts some
# 300 Python processes, and each compiled every module it imported (0.25 s of each start)
test: $(DEPS)
	env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

lint: $(DEPS)
	$(VENV)/bin/ruff check src tests bench
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy tests/static
	$(PY) -m pytest -q tests/test_docs.py -k links   # every relative link resolves

# the API reference, from the docstrings (tests/test_docs.py builds the same modules)
API_MODULES := simsearch simsearch.aio simsearch.lsh simsearch.quant simsearch.graph \
	simsearch.pyramid simsearch.strings simsearch.service.client simsearch.service.embedded \
	simsearch.integrations.langchain simsearch.integrations.llamaindex simsearch.service.errors
docs: $(PY)
	$(VENV)/bin/pdoc -o site/api $(API_MODULES)

# refresh the pins from the working .venv (then run make test in a fresh clone before committing)
constraints: $(PY)
	{ sed -n '1,2p' constraints.txt; $(PY) -m pip freeze --exclude-editable | \
	  sed 's/^torch==\([0-9.]*\)+cpu/torch==\1/' | sort -f; } > constraints.txt.new
	mv constraints.txt.new constraints.txt

bench-smoke: $(PY)
	$(PY) -m bench run bench/configs/smoke.yaml

clean:
	rm -rf $(VENV) build *.egg-info demo-results site
