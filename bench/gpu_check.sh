#!/usr/bin/env bash
# GPU check: on a machine with an NVIDIA GPU, install vLLM (CUDA build, its own venv), serve SmolLM2
# through a Skulk node, and report decode tok/s and TTFT through the node against vLLM's own server
# (bench/bench_vllm.py; one run, same server, ratios). Without an NVIDIA GPU it says so and exits 0
# (use `bench/bench_vllm.py --flavor cpu` for the CPU ratio).
#
#   bench/gpu_check.sh [--rounds N] [--max-tokens N]
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
OUT="${SKULK_BENCH_OUT:-$ROOT/bench/results}"
mkdir -p "$OUT"

echo "== hardware"
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "no NVIDIA GPU visible (nvidia-smi missing or failing): nothing to check here"
  exit 0
fi
nvidia-smi --query-gpu=name,memory.total,memory.free,driver_version,compute_cap --format=csv
"$PY" -m pip install -q -e "$ROOT/plugins/hardware" -e "$ROOT/plugins/engine-vllm"

echo "== doctor"
SKULK_PROFILE=cuda-vllm "$PY" -m skulk_kernel.cli doctor --json > "$OUT/gpu-doctor.json" || true
"$PY" - "$OUT/gpu-doctor.json" <<'EOF'
import json, sys
for r in json.load(open(sys.argv[1])):
    print(f"  {r['status']:<5} {r['check']:<10} {r['detail'][:160]}")
EOF

echo "== vLLM (CUDA) venv: installed once, cached"
SKULK_PROFILE=cuda-vllm "$PY" -m skulk_kernel.cli engines install vllm --flavor cuda

echo "== node vs vLLM's own server"
"$PY" "$ROOT/bench/bench_vllm.py" --flavor cuda --out "$OUT" "$@"
echo "report: $OUT/vllm-cuda.json"
