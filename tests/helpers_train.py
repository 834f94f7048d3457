"""Helpers of the training tests (not a test module, not part of the package): a toy tokenizer, corpus and
training config, and ways to run ``launch/pretrain.py`` (a driver script run by a fresh interpreter).

A 50k-token vocabulary makes the pondering products (2·d·V per token and pass) dominate a tiny model on a
CPU; the tests therefore train a ~300-token byte-level BPE on a slice of the bundled corpus, so a training
step takes milliseconds and the whole pipeline (prepare → train → checkpoint → export) still runs for real.
"""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

from conftest import REPO

TINY_VOCAB = 320


def tiny_corpus(folder: str | Path, documents: int = 24, chars_per_doc: int = 6000) -> Path:
    """Write ``documents`` text files cut from the bundled Sherlock Holmes / Alice texts into ``folder``."""
    from adaponder.data import bundled_corpus_dir

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    text = ""
    for name in ("pg1661.txt.gz", "11-0.txt.gz"):
        text += gzip.decompress((bundled_corpus_dir() / name).read_bytes()).decode("utf-8")
    start = 5000  # skip the Project Gutenberg header
    for i in range(documents):
        chunk = text[start + i * chars_per_doc: start + (i + 1) * chars_per_doc]
        (folder / f"doc{i:03d}.txt").write_text(chunk, encoding="utf-8")
    return folder


def tiny_tokenizer(path: str | Path, corpus: str | Path, vocab_size: int = TINY_VOCAB) -> Path:
    """Train a byte-level BPE (with ``<|endoftext|>`` and ``<|padding|>``) on the files of ``corpus``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>", "<|padding|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    files = sorted(str(p) for p in Path(corpus).glob("*.txt"))
    tok.train(files, trainer)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    return path


def tiny_data(root: str | Path) -> dict[str, Path]:
    """Corpus + tokenizer + prepared data under ``root`` (created once; reused when present)."""
    from adaponder.data.prepare import prepare

    root = Path(root)
    corpus = root / "corpus"
    tokenizer = root / "tokenizer.json"
    data = root / "prepared"
    if not (data / "meta.json").is_file():
        tiny_corpus(corpus)
        tiny_tokenizer(tokenizer, corpus)
        prepare([str(corpus)], data, tokenizer=str(tokenizer), val_fraction=0.1, seed=0, num_workers=1,
                progress=False)
    return {"corpus": corpus, "tokenizer": tokenizer, "data": data}


def tiny_train_config(data: Path, tokenizer: Path, out_dir: Path, **sections: Any) -> dict[str, Any]:
    """A training config mapping (the YAML's content) for a ~60k-parameter model; ``sections`` are merged in
    (``tiny_train_config(..., train={"steps": 8})``)."""
    cfg: dict[str, Any] = {
        "model": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64,
                  "vocab_size": TINY_VOCAB, "max_position_embeddings": 64, "rotary_pct": 0.25,
                  "use_parallel_residual": True, "tie_word_embeddings": False, "mode": "adaponder", "passes": 4},
        "data": {"path": str(data), "tokenizer": str(tokenizer), "seq_len": 32},
        "optim": {"lr": 3e-3, "warmup": 2},
        "schedule": {"s0": 0.25, "s1": 0.5, "ponder_weight": 0.5, "k_max": 0.3},
        "deepspeed": {"zero_stage": 1, "precision": "fp32"},
        "checkpoint": {"every": 1000, "keep": 3, "export_hf": False},
        "logging": {"every": 1, "progress_bar": False, "console": True, "peak_flops": 1e11},
        "eval": {"every": 0, "max_batches": 4, "at_end": True, "report": False},
        "train": {"out_dir": str(out_dir), "steps": 8, "micro_batch": 4, "grad_accum": 2, "seed": 7,
                  "threads": 1, "deterministic": True},
    }
    for name, values in sections.items():
        cfg.setdefault(name, {}).update(values)
    return cfg


def poison_checkpoint(tag_dir: str | Path) -> str:
    """NaN into one weight of a ZeRO-0 checkpoint, the manifest updated to match (as a checkpoint written before
    the finite flag, or altered by hand, would be). Returns the weight's name."""
    import json

    import torch

    from adaponder.train.checkpoint import file_sha256

    tag_dir = Path(tag_dir)
    f = tag_dir / "mp_rank_00_model_states.pt"
    sd = torch.load(f, map_location="cpu", weights_only=False)
    name = next(k for k, v in sd["module"].items() if v.is_floating_point())
    sd["module"][name].view(-1)[0] = float("nan")
    torch.save(sd, f)
    state = json.loads((tag_dir / "trainer_state.json").read_text())
    state["manifest"][f.name], state["sha256"][f.name] = f.stat().st_size, file_sha256(f)
    (tag_dir / "trainer_state.json").write_text(json.dumps(state))
    return name


# -- running the launcher from tests ----------------------------------------------------------------------
def cpu_env(**extra: str) -> dict[str, str]:
    """Environment for CPU runs: DeepSpeed's CPU accelerator (gloo), offline hubs, no wandb."""
    import os

    env = dict(os.environ)
    env.update(DS_ACCELERATOR="cpu", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               WANDB_MODE="disabled", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1",
               PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""))
    env.update(extra)
    return env


_WORKER = r"""
import contextlib, io, json, os, sys, traceback
reply = os.fdopen(os.dup(1), "w")  # replies only; anything else written to fd 1 goes where stderr goes
os.dup2(2, 1)
sys.path.insert(0, {launch!r})
sys.path.insert(0, {tests!r})
from faults import injected
from {script} import main
for line in sys.stdin:
    request = json.loads(line)
    buf = io.StringIO()
    try:
        with contextlib.redirect_stderr(buf), contextlib.redirect_stdout(buf), injected(request["faults"]):
            code = main(request["argv"])
    except BaseException:
        code, _ = -1, buf.write(traceback.format_exc())
    reply.write(json.dumps({{"code": code, "out": buf.getvalue()}}) + "\n")
    reply.flush()
"""


class LauncherWorker:
    """One long-lived Python process that runs ``launch/<script>.py main(argv)`` on request (default
    ``pretrain``; ``finetune_glue`` works alike), so a test module pays for importing torch/DeepSpeed/transformers
    once. ``run(*argv, faults=None) -> (exit code, output)``."""

    def __init__(self, cwd: str | Path | None = None, script: str = "pretrain"):
        import subprocess
        import sys

        code = _WORKER.format(launch=str(REPO / "launch"), tests=str(REPO / "tests"), script=script)
        self.proc = subprocess.Popen([sys.executable, "-u", "-c", code],
                                     cwd=str(cwd or REPO), env=cpu_env(), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)

    def run(self, *argv: str, faults: dict[str, Any] | None = None) -> tuple[int, str]:
        """``main(argv)`` with the faults of ``faults`` injected (``tests/faults.py``); an exception that escapes
        ``main`` is exit code -1 with its traceback in the output."""
        import json

        self.proc.stdin.write(json.dumps({"argv": [str(a) for a in argv], "faults": faults}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"launcher worker died (exit {self.proc.poll()})")
        reply = json.loads(line)
        return reply["code"], reply["out"]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except Exception:
                self.proc.kill()


def free_port() -> int:
    """A TCP port free right now (for ``--master_port``; fixed ports collide between concurrent test runs)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _deepspeed_cmd(config: str | Path, ranks: int, port: int, *args: str, script: Path | None = None) -> list[str]:
    import shutil
    import sys

    exe = shutil.which("deepspeed", path=str(Path(sys.executable).parent)) or "deepspeed"
    return [exe, "--num_gpus", str(ranks), "--master_port", str(port), str(script or REPO / "launch" / "pretrain.py"),
            "--config", str(config), *args]


def deepspeed_launch(config: str | Path, ranks: int, port: int, *args: str, timeout: float = 300,
                     cwd: str | Path | None = None, faults: dict[str, Any] | None = None):
    """``deepspeed --num_gpus N --master_port P launch/pretrain.py --config FILE ARGS`` on the CPU (gloo); with
    ``faults``, each rank runs the launcher with them injected (``tests/faults.py``)."""
    import json
    import subprocess

    script, env = None, cpu_env()
    if faults:
        from faults import RANK_SCRIPT

        script = Path(config).parent / "pretrain_with_faults.py"
        script.write_text(RANK_SCRIPT.format(launch=str(REPO / "launch"), tests=str(REPO / "tests")))
        env["ADAPONDER_TEST_FAULTS"] = json.dumps(faults)
    proc = subprocess.run(_deepspeed_cmd(config, ranks, port, *args, script=script), cwd=str(cwd or REPO), env=env,
                          capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stdout + proc.stderr


# launch/pretrain.py as a rank runs it (``sys.exit(main())`` in the rank process itself), recording the exit code.
_RECORDING_RANK = r"""
import os, sys
sys.path.insert(0, {launch!r})
from pretrain import main
code = main()
with open(os.path.join({folder!r}, "exit-rank" + os.environ["RANK"]), "w") as fh:
    fh.write(str(code))
sys.exit(code)
"""

_SIGNALLER = r"""
import ctypes, json, os, signal, subprocess, sys, time
import psutil
spec = json.loads(sys.argv[1])
if ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) != 0:  # PR_SET_CHILD_SUBREAPER
    sys.exit("prctl(PR_SET_CHILD_SUBREAPER) failed")
log = open(spec["log"], "w")
runner = subprocess.Popen(spec["cmd"], cwd=spec["cwd"], env=spec["env"], stdout=log, stderr=subprocess.STDOUT)
deadline = time.time() + spec["timeout"]
def ready():
    try:
        return len(open(spec["wait_for"]).read().splitlines()) >= spec["lines"]
    except OSError:
        return False
while not ready() and runner.poll() is None and time.time() < deadline:
    time.sleep(0.2)
tree = {p.pid: p.cmdline() for p in psutil.Process(runner.pid).children(recursive=True)}
tree[runner.pid] = spec["cmd"]  # (the ranks are reaped by deepspeed's launch.py, orphans by this process)
target = runner.pid if spec["target"] == "runner" else next(
    pid for pid, cmd in tree.items() if spec["target"] in " ".join(cmd))
if runner.returncode is None:
    os.kill(target, getattr(signal, spec["signal"]))
codes = {}
while time.time() < deadline:  # reap the whole tree: the orphans are ours now
    try:
        pid, status = os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
        break
    if pid == 0:
        time.sleep(0.2)
        continue
    codes[pid] = os.waitstatus_to_exitcode(status)
print(json.dumps({"signalled": target, "runner": runner.pid,
                  "procs": [{"pid": pid, "cmd": cmd, "code": codes.get(pid)} for pid, cmd in tree.items()]}))
"""


def signal_deepspeed_launch(config: str | Path, ranks: int, port: int, *args: str, wait_for: Path, lines: int,
                            target: str = "runner", sig: str = "SIGTERM", timeout: float = 300) -> dict[str, Any]:
    """Start ``deepspeed`` as in :func:`deepspeed_launch`, wait until ``wait_for`` has ``lines`` lines, send ``sig``
    to ``target`` (``"runner"``, or a text of the command line of a process of the launch tree), and wait for the
    whole tree to exit. Every orphan is reaped by a child subreaper (Linux), so the exit code of a launcher left
    behind is known too; each rank records what it exits with. Returns ``{"runner": pid, "signalled": pid,
    "procs": [{"pid", "cmd", "code"}], "rank_codes": {rank: code}, "log": text}`` (``code``: the exit code, minus
    the signal that killed it, or None when not reaped here: a rank, whose parent is launch.py)."""
    import json
    import subprocess
    import sys

    folder = Path(wait_for).parent.parent
    log = folder / f"{Path(wait_for).parent.name}.launch.log"
    script = folder / "recording_rank.py"
    script.write_text(_RECORDING_RANK.format(launch=str(REPO / "launch"), folder=str(folder)))
    spec = {"cmd": _deepspeed_cmd(config, ranks, port, *args, script=script), "cwd": str(REPO), "env": cpu_env(),
            "log": str(log), "wait_for": str(wait_for), "lines": lines, "target": target, "signal": sig,
            "timeout": timeout}
    proc = subprocess.run([sys.executable, "-c", _SIGNALLER, json.dumps(spec)], capture_output=True, text=True,
                          timeout=timeout + 60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    codes = {int(f.name.removeprefix("exit-rank")): int(f.read_text()) for f in folder.glob("exit-rank*")}
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "rank_codes": codes, "log": log.read_text()}


def read_metrics(out_dir: str | Path, kind: str = "train") -> list[dict[str, Any]]:
    import json

    path = Path(out_dir) / "metrics.jsonl"
    return [r for r in (json.loads(line) for line in path.read_text().splitlines()) if r.get("kind") == kind]


def write_config(path: str | Path, cfg: dict[str, Any]) -> Path:
    import yaml

    path = Path(path)
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


__all__ = ["tiny_corpus", "tiny_tokenizer", "tiny_data", "tiny_train_config", "TINY_VOCAB", "REPO", "cpu_env",
           "LauncherWorker", "deepspeed_launch", "free_port", "signal_deepspeed_launch", "read_metrics",
           "write_config", "poison_checkpoint"]
