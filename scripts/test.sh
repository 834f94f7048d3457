#!/usr/bin/env bash
# The test command: set up the environment, then run the whole test suite offline (both layers: unit, then
# integration). `bash scripts/test.sh --fast` runs the unit layer alone (a few minutes: no subprocess, no DeepSpeed
# rank, no compilation); `--integration` the other layer alone. Other arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=disabled TOKENIZERS_PARALLELISM=false
# Data locations have no defaults outside the checkout; the tests use the offline data pack beside it.
SHARED="${ADAPONDER_SHARED_DATA:-$(cd .. && pwd)/shared/data}"
export ADAPONDER_SHARED_DATA="$SHARED" ADAPONDER_EVAL_DATA="${ADAPONDER_EVAL_DATA:-$SHARED/eval}" \
  ADAPONDER_GLUE_DIR="${ADAPONDER_GLUE_DIR:-$SHARED/glue}"
layer=()
case "${1:-}" in
  --fast) layer=(-m "not integration"); shift ;;
  --integration) layer=(-m integration); shift ;;
esac
exec "${ADAPONDER_VENV:-.venv}/bin/python" -m pytest -q "${layer[@]}" "$@"
