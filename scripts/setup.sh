#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment and install AdaPonder into it.
# torch is installed first and pinned through constraints.txt, so no later resolver step can replace
# the CPU wheel by a multi-GB CUDA build. On a CUDA machine: TORCH_SPEC="torch==<version>" bash scripts/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${ADAPONDER_VENV:-.venv}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
# pip runs quietly (-q) so CI logs stay readable; each step says first what it installs and how long it takes,
# so a first run is never minutes of silence. A re-run with everything installed takes seconds.
if [ ! -x "$VENV/bin/python" ]; then
  echo "== setup: creating the virtual environment $VENV"
  python3 -m venv "$VENV"
fi
PIP="$VENV/bin/pip"
"$PIP" install -q --upgrade pip 2>/dev/null || true
echo "== setup: installing $TORCH_SPEC into $VENV (a minute or two on a first run)"
"$PIP" install -q "$TORCH_SPEC"
# Pin whichever torch is now installed, so the rest resolves against it. (NumPy comes with the next install: torch
# would warn here that it cannot find it.)
"$VENV/bin/python" -W ignore::UserWarning -c "import torch; print('torch==' + torch.__version__.split('+')[0])" > "$VENV/torch-constraint.txt"
echo "== setup: installing adaponder (editable) with transformers, DeepSpeed, lm-eval and the test tools (a minute or two)"
"$PIP" install -q -c "$VENV/torch-constraint.txt" -e ".[dev]"
# DeepSpeed compiles its CPU collectives on first use: once here, in this environment's own folder, instead of at
# a run's start (seconds when already built)
echo "== setup: building DeepSpeed's CPU collectives for $VENV (about a minute on a first run)"
"$VENV/bin/adaponder" build-extensions
echo "environment ready: $VENV ($("$VENV/bin/python" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'))"
