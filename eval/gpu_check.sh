#!/usr/bin/env bash
# GPU check: on a CUDA machine, measure bf16 training MFU at the Pythia-70M and -410M shapes
# decode tokens/s (eager and compiled), prefill and decode with halting against without (the measured
# compaction rule), self-speculative decoding, every decoding strategy through generate(decoding=...) (eager and
# compiled, each schedule), and append the figures (with date and hardware) to docs/benchmarks.md.
# GPU_CHECK_OUT=DIR keeps the raw tables and JSON there (default: a temporary folder).
#
#   TORCH_SPEC="torch==2.13.0" bash scripts/setup.sh   # a CUDA build of torch
#   bash eval/gpu_check.sh                              # ~5 min on one H100/H200
#   bash eval/gpu_check.sh --smoke                      # every step at a tiny size on the CPU (CI runs it), so the
#                                                       # script a lent GPU will run is known to work; writes no docs
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${ADAPONDER_VENV:-.venv}/bin/python"
[ -x "$PY" ] || PY=python3
smoke=0
case "${1:-}" in
  --smoke) smoke=1 ;;
  "") ;;
  *) echo "error: unknown argument ${1} (expected nothing, or --smoke)" >&2; exit 2 ;;
esac
out="${GPU_CHECK_OUT:-$(mktemp -d)}"; mkdir -p "$out"
if [ "$smoke" = 1 ]; then
  # the same steps and flags, at the tiny shape, fp32, on the CPU, one timed round each
  DEV=cpu DT=fp32 S70=tiny S410=tiny SEQ=32 CTX=16 NEW=4 STEPS=1 REP=1 REPC=1 B8=2 B4=1 BATCHES=1,2
  export DS_ACCELERATOR=cpu
else
  "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device: this script measures GPU figures (--smoke runs it at a tiny size on the CPU)')"
  DEV=cuda DT=bf16 S70=70m S410=410m SEQ=2048 CTX=512 NEW=64 STEPS=5 REP=2 REPC=3 B8=8 B4=4 BATCHES=1,8,32
fi
"$PY" eval/bench_train.py --device $DEV --dtypes $DT --size $S70 --seq $SEQ --batches $B8 --memory-batch 0 \
  --variants naive,hf-1pass,ponderlm,adaponder --steps $STEPS --json "$out/train70m.json" | tee "$out/train70m.txt"
"$PY" eval/bench_train.py --device $DEV --dtypes $DT --size $S410 --seq $SEQ --batches $B4 --memory-batch 0 \
  --variants hf-1pass,adaponder --steps $STEPS --json "$out/train410m.json" | tee "$out/train410m.txt"
"$PY" eval/bench_inference.py --device $DEV --dtype $DT --size $S70 --context $CTX --new-tokens $NEW \
  --batches $BATCHES --repeats $REP --json "$out/infer70m.json" | tee "$out/infer70m.txt"
"$PY" eval/bench_compiled.py --device $DEV --dtype $DT --shapes $S70,$S410 --batches $BATCHES --context $CTX \
  --new-tokens $NEW --repeats $REPC --json "$out/compiled.json" | tee "$out/compiled.txt"
"$PY" eval/bench_speculative.py --device $DEV --shapes $S70:adaponder --batches 1,$B8 --dtypes $DT --gammas 4,8 \
  --adaptive --context $((CTX < 256 ? CTX : 256)) --new-tokens $NEW --repeats $REP --json "$out/speculative.json" \
  | tee "$out/speculative.txt"
# every strategy of the one entry, side by side (guarded as the pipelined row below: a failure keeps the rest)
if ! "$PY" eval/bench_generation.py --device $DEV --dtype $DT --shapes $S70:ponderlm,$S70:adaponder --batches 1 \
    --context $((CTX < 256 ? CTX : 256)) --new-tokens $NEW --repeats $REP --json "$out/generation.json" \
    > "$out/generation.txt" 2>&1; then
  echo "generation strategies failed: see $out/generation.txt" | tee -a "$out/generation.txt"
  [ "$smoke" = 1 ] && { cat "$out/generation.txt" >&2; exit 1; }
fi
# the pipelined passes last and guarded: a failure there keeps every figure above (random weights draft badly, so the
# row reads the cost of a tick against an ordinary pass on the GPU, not a trained draft's speed-up). The smoke run
# lets no failure pass.
if ! "$PY" eval/bench_speculative.py --device $DEV --shapes $S70:ponderlm --batches 1 --dtypes $DT --gammas 4 \
    --pipelined --context $((CTX < 256 ? CTX : 256)) --new-tokens $NEW --repeats $REP --json "$out/pipelined.json" \
    > "$out/pipelined.txt" 2>&1; then
  echo "pipelined row failed: see $out/pipelined.txt" | tee -a "$out/pipelined.txt"
  [ "$smoke" = 1 ] && { cat "$out/pipelined.txt" >&2; exit 1; }
fi
tables=("$out/train70m.txt" "$out/train410m.txt" "$out/infer70m.txt" "$out/compiled.txt" "$out/speculative.txt"
        "$out/generation.txt" "$out/pipelined.txt")
if [ "$smoke" = 1 ]; then
  for t in "${tables[@]}"; do [ -s "$t" ] || { echo "error: the smoke run wrote no table to $t" >&2; exit 1; }; done
  echo "gpu_check smoke: every step ran on the CPU at the tiny shape (tables in $out; docs/benchmarks.md untouched)"
  exit 0
fi
hw=$("$PY" -c "import torch; p = torch.cuda.get_device_properties(0); print(f'{p.name}, {p.total_memory / 2**30:.0f} GiB, torch {torch.__version__}')")
{
  echo
  echo "## GPU check, $(date -u +%Y-%m-%d), ${hw}"
  echo
  echo '```'
  cat "${tables[@]}"
  echo '```'
} >> docs/benchmarks.md
echo "appended to docs/benchmarks.md"
