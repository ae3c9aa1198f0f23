#!/usr/bin/env bash
# GPU check, on a machine with an NVIDIA GPU (and the package indexes reachable):
#
#   llama (default): measure SmolLM2's decode rate on llama.cpp's CPU build, install the CUDA build
#     (`skulk-kernel engines install llamacpp-cuda`, into this environment), load the same GGUF through
#     the runner's path placed on llama_server-cuda (every layer offloaded, checked), measure again and
#     report the ratio (bench/bench_llama_gpu.py -> bench/results/llama-gpu.json).
#   vllm: install vLLM (CUDA build, its own venv), serve SmolLM2 through a Skulk node and report decode
#     tok/s and TTFT through the node against vLLM's own server (bench/bench_vllm.py -> vllm-cuda.json).
#   all: both.
#
# Without an NVIDIA GPU it fails (exit 2) and says why; nothing is installed.
#
#   bench/gpu_check.sh [llama|vllm|all] [options for bench_vllm.py]
#   (after the llama check the CUDA build stays installed; `pip install --force-reinstall xllamacpp`
#   from PyPI puts the CPU build back)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
OUT="${SKULK_BENCH_OUT:-$ROOT/bench/results}"
MODE="${1:-llama}"
case "$MODE" in llama|vllm|all) shift || true ;; -*) MODE=llama ;; *) echo "usage: $0 [llama|vllm|all]" >&2; exit 64 ;; esac
mkdir -p "$OUT"

echo "== hardware"
if ! command -v nvidia-smi >/dev/null 2>&1; then
  echo "FAIL: no NVIDIA GPU here: nvidia-smi is not installed (no NVIDIA driver); nothing was checked" >&2
  exit 2
fi
if ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  echo "FAIL: no NVIDIA GPU here: nvidia-smi -L lists none ($(nvidia-smi -L 2>&1 | head -1)); nothing was checked" >&2
  exit 2
fi
nvidia-smi --query-gpu=name,memory.total,memory.free,driver_version,compute_cap --format=csv
"$PY" -m pip install -q -e "$ROOT/plugins/hardware"

echo "== doctor"
SKULK_PROFILE="${SKULK_PROFILE:-auto}" "$PY" -m skulk_kernel.cli doctor --json > "$OUT/gpu-doctor.json" || true
"$PY" - "$OUT/gpu-doctor.json" <<'EOF'
import json, sys
for r in json.load(open(sys.argv[1])):
    print(f"  {r['status']:<5} {r['check']:<10} {r['detail'][:160]}")
EOF

if [ "$MODE" != vllm ]; then
  echo "== llama.cpp: CPU build (before the install)"
  rm -f "$OUT"/llama-cpu.json "$OUT"/llama-cuda.json "$OUT"/llama-gpu.json
  # the CPU build first: the CUDA build replaces it (one package, xllamacpp); a GPU build left by an
  # earlier run is swapped back for PyPI's CPU build
  "$PY" -c "from skulk_engine_llamacpp.engine import LlamaServerEngine as E; raise SystemExit(E().build() != 'cpu')" ||
    "$PY" -m pip install -q --force-reinstall --no-deps xllamacpp
  "$PY" "$ROOT/bench/bench_llama_gpu.py" measure --label cpu --backend llama_server-cpu --out "$OUT"
  echo "== llama.cpp: install the CUDA build"
  SKULK_PROFILE=cpu-llamacpp "$PY" -m skulk_kernel.cli engines install llamacpp-cuda
  echo "== llama.cpp: CUDA build, every layer on the GPU"
  "$PY" "$ROOT/bench/bench_llama_gpu.py" measure --label cuda --backend llama_server-cuda --out "$OUT"
  "$PY" "$ROOT/bench/bench_llama_gpu.py" report "$OUT"
  echo "report: $OUT/llama-gpu.json"
fi

if [ "$MODE" != llama ]; then
  "$PY" -m pip install -q -e "$ROOT/plugins/engine-vllm"
  echo "== vLLM (CUDA) venv: installed once, cached"
  SKULK_PROFILE=cuda-vllm "$PY" -m skulk_kernel.cli engines install vllm --flavor cuda
  echo "== node vs vLLM's own server"
  "$PY" "$ROOT/bench/bench_vllm.py" --flavor cuda --out "$OUT" "$@"
  echo "report: $OUT/vllm-cuda.json"
fi
