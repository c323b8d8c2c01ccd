# Set-up and the main jobs. Needs only Python 3.10+ and make.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: test lint install docs

$(PY):
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: $(PY) setup.cfg pyproject.toml
	$(PY) -m pip install -e ".[dev]"
	touch $@

install: $(VENV)/.installed

lint: install
	$(PY) -m ruff check contrastive recipes tools tests benchmarks
	$(PY) -m mypy  # the package; settings in setup.cfg [mypy]

test: install
	$(PY) -m pytest

# The manual (docs/, mkdocs.yml) into site/; --strict: a broken link, anchor or API reference
# fails. The docs extra is installed on first use only, so `make test` does not need it.
$(VENV)/.installed-docs: $(VENV)/.installed
	$(PY) -m pip install -e ".[docs]"
	touch $@

docs: $(VENV)/.installed-docs
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir site

# The main job on the built-in data: pretrain MoCo for a few CPU minutes, then evaluate.
# DATA: any --data spec (default: the built-in shapes at 24 px), e.g. make demo DATA=cifar10
DATA ?=
.PHONY: demo
demo: install
	$(PY) tools/demo.py $(if $(DATA),--data $(DATA))
