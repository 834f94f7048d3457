#!/usr/bin/env bash
# The README demo: set up, prepare the bundled public-domain corpus, train the tiny AdaPonderLM of
# configs/tiny.yaml on the CPU for a few minutes, print the report and save a Hugging Face checkpoint.
#
#   bash scripts/demo.sh                    # output in runs/demo/ (report.md, exit_pass_hist.png, hf/, metrics.jsonl)
#   DEMO_COMPARE=1 bash scripts/demo.sh     # also train mode=ponderlm on the same budget (runs/demo-ponderlm/)
#   bash scripts/demo.sh --set train.steps=20   # extra arguments go to launch/pretrain.py
#
# Re-running continues (or just re-reports) the same run: it uses --resume auto.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
PY="${ADAPONDER_VENV:-.venv}/bin/python"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE="${WANDB_MODE:-disabled}"
export TOKENIZERS_PARALLELISM=false DS_ACCELERATOR="${DS_ACCELERATOR:-cpu}"

if [ ! -f data/bundled/meta.json ]; then
  echo "== preparing the bundled corpus (5 Project Gutenberg books) into data/bundled with the Pythia tokenizer"
  "$PY" -m adaponder.cli.prepare --bundled -o data/bundled -j 2
fi

train() {  # $1 = output folder, then extra arguments
  local out="$1"; shift
  local t0=$SECONDS
  "$PY" launch/pretrain.py --config configs/tiny.yaml --set "train.out_dir=$out" --resume auto "$@"
  echo "== $out: wall time $((SECONDS - t0)) s"
}

echo "== training configs/tiny.yaml (adaponder, K=4) on the CPU"
train runs/demo "$@"
if [ "${DEMO_COMPARE:-0}" = "1" ]; then
  echo "== same budget, mode=ponderlm (K=4 passes for every token, no gates)"
  train runs/demo-ponderlm --set model.mode=ponderlm "$@"
fi

echo
cat runs/demo/report.md
echo
echo "Hugging Face checkpoint: runs/demo/hf  (AutoModelForCausalLM.from_pretrained('runs/demo/hf', trust_remote_code=True))"
if [ "${DEMO_COMPARE:-0}" = "1" ]; then
  "$PY" - <<'PY'
import json
for run in ("runs/demo", "runs/demo-ponderlm"):
    ev = [json.loads(l) for l in open(f"{run}/metrics.jsonl") if '"kind": "eval"' in l][-1]
    print(f"{run:22s} val_loss {ev['val_loss']:.4f}  ppl {ev['val_ppl']:.1f}  mean exit pass {ev['mean_exit_pass']:.3f}")
PY
fi
