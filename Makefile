# Set-up and checks for a fresh machine. Everything installs into $(VENV).
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
TEST_EXTRAS ?= dev,bench,service,strings,cluster

.PHONY: demo test lint bench-smoke clean

$(PY):
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip

demo: $(PY)
	$(PIP) install -q -e ".[bench,strings]"
	$(VENV)/bin/simsearch demo

test: $(PY)
	$(PIP) install -q -e ".[$(TEST_EXTRAS)]"
	$(PY) -m pytest -q

lint: $(PY)
	$(VENV)/bin/ruff check src tests bench

bench-smoke: $(PY)
	$(PY) -m bench run bench/configs/smoke.yaml

clean:
	rm -rf $(VENV) build *.egg-info demo-results
