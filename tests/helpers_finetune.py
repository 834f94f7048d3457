"""Helpers of the fine-tuning tests (not a test module, not part of the package): running
``launch/finetune_glue.py`` in a long-lived worker process, as a script, and under the ``deepspeed`` launcher.

Fine-tuning joins a (1-rank) process group and sets ``RANK``/``MASTER_PORT`` in its environment, so tests run
it in other processes, never in pytest's own (a later subprocess would inherit the variables and try to
join pytest's group). :data:`SMOKE` is a tiny recipe: a loop-mode core of width 64 and one layer, 64 train
and 48 dev examples, one step per evaluation.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from conftest import REPO
from helpers_train import LauncherWorker, cpu_env

SCRIPT = REPO / "launch" / "finetune_glue.py"

SMOKE = ["model.core_mode=loop", "model.random_shape={hidden_size: 64, num_hidden_layers: 1, "
         "num_attention_heads: 4, intermediate_size: 128}", "train.lr=1e-3", "train.lambda_lr=1e-3",
         "train.max_examples=64", "train.epochs=1", "train.eval_every=1", "train.log_every=0",
         "eval.max_examples=48", "eval.sample_draws=2", "timing.max_examples=8", "timing.repeats=1",
         "timing.batch_sizes=[1, 8]", "train.threads=1", "timing.threads=1"]


def sets(*overrides: str) -> list[str]:
    """``["a=1", "b=2"]`` → ``["--set", "a=1", "--set", "b=2"]``."""
    return [a for s in overrides for a in ("--set", s)]


def finetune_argv(task: str, output: str | Path, *overrides: str, init: str = "tiny-random",
                  smoke: bool = True) -> list[str]:
    """Arguments of ``launch/finetune_glue.py`` for ``configs/glue/<task>.yaml`` (``SMOKE`` + ``overrides``)."""
    return ["--config", str(REPO / "configs" / "glue" / f"{task}.yaml"), "--init", init, "--output", str(output),
            *sets(*(SMOKE if smoke else []), *overrides)]


class FinetuneWorker(LauncherWorker):
    """One Python process that runs ``launch/finetune_glue.py main(argv)`` on request (one import of
    torch/DeepSpeed/transformers, one 1-rank process group for all runs). ``run(argv) -> (exit code, output)``."""

    def __init__(self, cwd: str | Path | None = None):
        super().__init__(cwd, script="finetune_glue")

    def run(self, argv: list[str]) -> tuple[int, str]:
        return super().run(*argv)


def start_script(argv: list[str]) -> subprocess.Popen:
    """``python launch/finetune_glue.py ARGV`` in the background (stdout and stderr together, text)."""
    return subprocess.Popen([sys.executable, str(SCRIPT), *argv], cwd=str(REPO), env=cpu_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def deepspeed_finetune(argv: list[str], ranks: int, port: int, timeout: float = 900) -> tuple[int, str]:
    """``deepspeed --num_gpus N --master_port P launch/finetune_glue.py --deepspeed ARGV`` on the CPU (gloo)."""
    exe = shutil.which("deepspeed", path=str(Path(sys.executable).parent)) or "deepspeed"
    proc = subprocess.run([exe, "--num_gpus", str(ranks), "--master_port", str(port), str(SCRIPT), "--deepspeed",
                           *argv], cwd=str(REPO), env=cpu_env(), capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stdout + proc.stderr


def free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_jsonl(path: str | Path, kind: str | None = None) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    return [r for r in rows if kind is None or r.get("kind") == kind]


__all__ = ["SMOKE", "SCRIPT", "sets", "finetune_argv", "FinetuneWorker", "start_script", "deepspeed_finetune",
           "free_port", "read_jsonl"]
