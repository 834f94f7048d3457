#!/usr/bin/env bash
# GPU check: on a CUDA machine, measure bf16 training MFU at the Pythia-70M and -410M shapes
# decode tokens/s (eager and compiled), prefill and decode with halting against without (the measured
# compaction rule), self-speculative decoding, and append the figures (with date and hardware) to docs/benchmarks.md.
# GPU_CHECK_OUT=DIR keeps the raw tables and JSON there (default: a temporary folder).
#
#   TORCH_SPEC="torch==2.13.0" bash scripts/setup.sh   # a CUDA build of torch
#   bash eval/gpu_check.sh                              # ~5 min on one H100/H200
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${ADAPONDER_VENV:-.venv}/bin/python"
[ -x "$PY" ] || PY=python3
"$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device: this script measures GPU figures')"
out="${GPU_CHECK_OUT:-$(mktemp -d)}"; mkdir -p "$out"
hw=$("$PY" -c "import torch; p = torch.cuda.get_device_properties(0); print(f'{p.name}, {p.total_memory / 2**30:.0f} GiB, torch {torch.__version__}')")
"$PY" eval/bench_train.py --device cuda --dtypes bf16 --size 70m --seq 2048 --batches 8 --memory-batch 0 \
  --variants naive,hf-1pass,ponderlm,adaponder --steps 5 --json "$out/train70m.json" | tee "$out/train70m.txt"
"$PY" eval/bench_train.py --device cuda --dtypes bf16 --size 410m --seq 2048 --batches 4 --memory-batch 0 \
  --variants hf-1pass,adaponder --steps 5 --json "$out/train410m.json" | tee "$out/train410m.txt"
"$PY" eval/bench_inference.py --device cuda --dtype bf16 --size 70m --context 512 --new-tokens 64 \
  --json "$out/infer70m.json" | tee "$out/infer70m.txt"
"$PY" eval/bench_compiled.py --device cuda --dtype bf16 --shapes 70m,410m --batches 1,8,32 --context 512 \
  --new-tokens 64 --json "$out/compiled.json" | tee "$out/compiled.txt"
"$PY" eval/bench_speculative.py --device cuda --shapes 70m:adaponder --batches 1,8 --dtypes bf16 --gammas 4,8 \
  --adaptive --context 256 --new-tokens 64 --repeats 2 --json "$out/speculative.json" | tee "$out/speculative.txt"
# the pipelined passes last and guarded: a failure there keeps every figure above (random weights draft badly, so the
# row reads the cost of a tick against an ordinary pass on the GPU, not a trained draft's speed-up)
if ! "$PY" eval/bench_speculative.py --device cuda --shapes 70m:ponderlm --batches 1 --dtypes bf16 --gammas 4 \
    --pipelined --context 256 --new-tokens 64 --repeats 2 --json "$out/pipelined.json" > "$out/pipelined.txt" 2>&1; then
  echo "pipelined row failed: see $out/pipelined.txt" | tee -a "$out/pipelined.txt"
fi
{
  echo
  echo "## GPU check, $(date -u +%Y-%m-%d), ${hw}"
  echo
  echo '```'
  cat "$out/train70m.txt" "$out/train410m.txt" "$out/infer70m.txt" "$out/compiled.txt" "$out/speculative.txt" \
    "$out/pipelined.txt"
  echo '```'
} >> docs/benchmarks.md
echo "appended to docs/benchmarks.md"
