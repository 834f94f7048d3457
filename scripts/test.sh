#!/usr/bin/env bash
# The test command: set up the environment, then run the whole test suite offline.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=disabled TOKENIZERS_PARALLELISM=false
exec "${ADAPONDER_VENV:-.venv}/bin/python" -m pytest -q "$@"
