"""The reliability matrix: every failure case of docs/reliability.md run as a user meets it, end to end.

Each case runs the real command-line tools (or a short Python script for the model API) in a fresh process with
a time limit and sorts the outcome into one class:

* ``clear error``  — the expected refusal: the expected exit code, one ``error:`` line (or the expected
  exception's message) naming what it must name, no traceback;
* ``recovered``    — the operation completed and what it left is correct (checked per case);
* ``hang``         — the time limit ran out;
* ``traceback``    — a user error shown as a stack trace;
* ``silent``       — exit 0 (or no exception) where a refusal was due, or a wrong result accepted;
* ``data loss``    — something already saved was lost or left unloadable;
* ``unclear``      — refused, but not with one line naming what the case requires.

The toy corpus, tokenizer and training config are the test suite's (``tests/helpers_train.py``): a training step
takes milliseconds, so the whole matrix runs in a few minutes on two CPU cores. The full-disk cases mount small
tmpfs folders and need root (they are reported as skipped otherwise).

    python eval/reliability_matrix.py                    # all cases -> runs/reliability-matrix/{matrix.md,matrix.jsonl}
    python eval/reliability_matrix.py --only lock,disk   # cases whose name contains one of these
    python eval/reliability_matrix.py --list
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the suite's toy data and config
sys.path.insert(0, str(REPO))

from helpers_train import cpu_env, poison_checkpoint as _poison, tiny_data, tiny_train_config, write_config  # noqa: E402

CLASSES = ("clear error", "recovered", "hang", "traceback", "silent", "data loss", "unclear", "skipped")
BAD = ("hang", "traceback", "silent", "data loss", "unclear")


@dataclass
class Outcome:
    case: str
    finding: str
    outcome: str
    detail: str
    seconds: float = 0.0


@dataclass
class Proc:
    rc: int | None  # None: killed at the time limit
    out: str
    err: str

    @property
    def last_error(self) -> str:
        """The last ``error:`` line with the ``  - problem`` lines under it (a config error lists each problem),
        or the last line when there is none."""
        lines = [ln for ln in self.err.splitlines() if ln.strip()]
        starts = [i for i, ln in enumerate(lines) if ln.startswith("error: ")]
        if not starts:
            return lines[-1] if lines else ""
        block = lines[starts[-1]:]
        if all(ln.startswith("  - ") for ln in block[1:]):
            return " ".join(ln.strip() for ln in block)
        return lines[-1]


class Matrix:
    """The shared fixtures (toy data, a finished base run) and the ways of running a case."""

    def __init__(self, work: Path, timeout: float):
        self.work = work
        self.timeout = timeout
        self.env = cpu_env(PYTHONPATH=str(REPO))
        self.env.pop("ADAPONDER_DEBUG", None)
        self.data = tiny_data(work / "toy")
        self._base: Path | None = None

    # -- running ------------------------------------------------------------------------------------------
    def run(self, *args: str | Path, timeout: float | None = None, cwd: Path | None = None,
            env: dict[str, str] | None = None) -> Proc:
        cmd = [sys.executable, *map(str, args)]
        try:
            p = subprocess.run(cmd, env={**self.env, **(env or {})}, capture_output=True, text=True,
                               timeout=timeout or self.timeout, cwd=cwd or self.work)
            return Proc(p.returncode, p.stdout, p.stderr)
        except subprocess.TimeoutExpired as e:
            return Proc(None, _text(e.stdout), _text(e.stderr))

    def start(self, *args: str | Path) -> subprocess.Popen:
        # Ctrl-C's default action in the child, as from a terminal (a matrix run in the background has SIGINT
        # ignored, and a child would inherit that and never see the Ctrl-C a case sends)
        return subprocess.Popen([sys.executable, *map(str, args)], env=self.env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, cwd=self.work,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))

    def pretrain(self, cfg: Path, *extra: str, timeout: float | None = None) -> Proc:
        return self.run("-m", "adaponder.cli.pretrain", "--config", cfg, *extra, timeout=timeout)

    def python(self, code: str) -> Proc:
        return self.run("-c", textwrap.dedent(code))

    # -- fixtures -----------------------------------------------------------------------------------------
    def config(self, name: str, out_dir: Path | None = None, **sections) -> Path:
        folder = self.work / name
        folder.mkdir(parents=True, exist_ok=True)
        base = {"train": {"steps": 6}, "checkpoint": {"every": 2, "export_hf": False},
                "deepspeed": {"zero_stage": 0}, "eval": {"at_end": False}}
        for key, values in sections.items():
            base.setdefault(key, {}).update(values)
        cfg = tiny_train_config(self.data["data"], self.data["tokenizer"], out_dir or folder / "run", **base)
        return write_config(folder / "run.yaml", cfg)

    def base_run(self) -> Path:
        """A 6-step ZeRO-0 run stopped at step 4, with checkpoints at steps 2 and 4 (made once, copied by the
        cases that resume it)."""
        if self._base is None:
            cfg = self.config("base", train={"stop_at": 4})
            p = self.pretrain(cfg)
            if p.rc != 0:
                raise RuntimeError(f"the base run failed (exit {p.rc}):\n{p.err[-3000:]}")
            self._base = cfg.parent / "run"
        return self._base

    def copy_of_base(self, name: str, **sections) -> tuple[Path, Path]:
        """A copy of the base run under ``name`` and a config pointing at it; returns (config, run folder)."""
        run = self.work / name / "run"
        if run.exists():
            shutil.rmtree(run)
        shutil.copytree(self.base_run(), run)
        return self.config(name, out_dir=run, **sections), run


def _text(b) -> str:
    return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")


def refusal(p: Proc, *must_name: str, rc: int = 2) -> tuple[str, str]:
    """Classify a command that must refuse with exit ``rc`` and one ``error:`` line naming ``must_name``."""
    if p.rc is None:
        return "hang", "killed at the time limit"
    if "Traceback (most recent call last)" in p.err:
        return "traceback", p.err.strip().splitlines()[-1][:300]
    if p.rc == 0:
        return "silent", "exit 0"
    line = p.last_error
    missing = [m for m in must_name if m not in line]
    if p.rc != rc or not line.startswith("error: ") or missing:
        return "unclear", f"exit {p.rc}; last line {line[:300]!r}; missing {missing}"
    return "clear error", f"exit {p.rc}: {line[:300]}"


def raised(p: Proc, *must_name: str) -> tuple[str, str]:
    """Classify an API script that prints ``RAISED <type>: <message>`` when the call refused (else ``ACCEPTED``)."""
    if p.rc is None:
        return "hang", "killed at the time limit"
    found = [ln for ln in p.out.splitlines() if ln.startswith(("RAISED", "ACCEPTED"))]
    if not found:
        return "traceback", (p.err.strip().splitlines() or ["no output"])[-1][:300]
    line = found[-1]
    if line.startswith("ACCEPTED"):
        return "silent", line[:300]
    missing = [m for m in must_name if m not in line]
    return ("unclear", f"{line[:300]} (missing {missing})") if missing else ("clear error", line[:300])


def _api(call: str) -> str:
    """A script running ``call`` on a tiny model and printing how it ended."""
    return f"""
import torch
from adaponder.modeling import AdaPonderConfig, AdaPonderForCausalLM
torch.manual_seed(0)
model = AdaPonderForCausalLM(AdaPonderConfig(vocab_size=97, hidden_size=32, num_hidden_layers=2,
    num_attention_heads=4, intermediate_size=64, max_position_embeddings=32, mode="adaponder")).eval()
try:
    out = {call}
    print("ACCEPTED", type(out).__name__, getattr(out, "loss", None))
except (ValueError, TypeError) as err:
    print("RAISED", type(err).__name__ + ":", " ".join(str(err).split()))
"""


def _loadable(m: Matrix, ck: Path) -> tuple[bool, str]:
    """Whether every checkpoint under ``ck`` verifies and exports (what a later resume or export needs)."""
    tags = sorted(p for p in ck.glob("step*") if p.is_dir())
    if not tags:
        return False, f"no checkpoint under {ck}"
    for tag in tags:
        out = m.work / "exports" / f"{ck.parent.parent.name}-{tag.name}"
        shutil.rmtree(out, ignore_errors=True)
        p = m.run("-m", "adaponder.cli.export_hf", tag, out)
        if p.rc != 0:
            return False, f"{tag} does not export: {p.last_error[:200]}"
    return True, f"{len(tags)} checkpoints verify and export"


# -- the cases ------------------------------------------------------------------------------------------------
def case_lock_two_runs(m: Matrix) -> tuple[str, str]:
    # long enough (about a minute) that the second job starts while the first still trains
    cfg = m.config("lock-runs", train={"steps": 1500}, checkpoint={"every": 100, "keep": 3},
                   logging={"every": 50})
    run = cfg.parent / "run"
    first = m.start("-m", "adaponder.cli.pretrain", "--config", cfg)
    deadline = time.time() + m.timeout
    while time.time() < deadline and not (run / "metrics.jsonl").is_file() and first.poll() is None:
        time.sleep(0.1)
    second = m.pretrain(cfg)
    running = first.poll() is None
    out, err = first.communicate(timeout=m.timeout)
    if not running:
        return "unclear", "the first run ended before the second started: lengthen it"
    verdict = refusal(second, "is in use by another job", "PID")
    if first.returncode != 0:
        return "data loss", f"the first run failed (exit {first.returncode}): {err.strip()[-300:]}"
    ok, what = _loadable(m, run / "checkpoints")
    return (verdict[0], f"{verdict[1]}; first run exit 0, {what}") if ok else ("data loss", what)


def case_lock_two_prepares(m: Matrix) -> tuple[str, str]:
    out = m.work / "lock-prepare" / "out"
    shutil.rmtree(out.parent, ignore_errors=True)
    out.parent.mkdir(parents=True)
    args = ("-m", "adaponder.cli.prepare", m.data["corpus"], "-o", out, "--tokenizer", m.data["tokenizer"],
            "-j", "1", "--no-progress", "--shard-tokens", "2000")
    a, b = m.start(*args), m.start(*args)
    results = [(p.wait(timeout=m.timeout), p.stderr.read()) for p in (a, b)]
    codes = sorted(rc for rc, _ in results)
    if codes != [0, 2]:
        return "silent" if codes == [0, 0] else "unclear", f"exit codes {codes}"
    err = next(e for rc, e in results if rc == 2)
    verdict = refusal(Proc(2, "", err), "in use by another job")
    if not (out / "meta.json").is_file():
        return "data loss", "no prepared output left"
    return verdict[0], verdict[1] + "; the other wrote a complete output"


def case_nonfinite_resume_explicit(m: Matrix) -> tuple[str, str]:
    cfg, run = m.copy_of_base("nan-explicit")
    step4 = run / "checkpoints" / "step00000004"
    name = _poison(step4)
    return refusal(m.pretrain(cfg, "--resume", str(step4)), str(step4), name, "not all finite")


def case_nonfinite_resume_auto_keeps_last_good(m: Matrix) -> tuple[str, str]:
    cfg, run = m.copy_of_base("nan-auto")
    ck = run / "checkpoints"
    _poison(ck / "step00000004")
    p = m.pretrain(cfg, "--resume", "auto")
    if p.rc is None:
        return "hang", "killed at the time limit"
    if p.rc != 0 or "resuming from" not in p.err + p.out:
        return refusal(p)
    ok, what = _loadable(m, ck)
    return ("recovered", f"fell back to step 2 and finished; {what}") if ok else ("data loss", what)


def case_nonfinite_export(m: Matrix) -> tuple[str, str]:
    cfg, run = m.copy_of_base("nan-export")
    tag = run / "checkpoints" / "step00000002"
    _poison(tag)
    p = m.run("-m", "adaponder.cli.export_hf", tag, m.work / "nan-export" / "hf")
    return refusal(p, str(tag), "not all finite")


def case_nonfinite_exported_weights_perplexity(m: Matrix) -> tuple[str, str]:
    hf = m.work / "nan-ppl" / "hf"
    shutil.rmtree(hf.parent, ignore_errors=True)
    p = m.run("-m", "adaponder.cli.export_hf", m.base_run() / "checkpoints" / "step00000004", hf)
    if p.rc != 0:
        return "unclear", f"export failed: {p.last_error}"
    m.python(f"""
        from safetensors.torch import load_file, save_file
        w = load_file({str(hf / 'model.safetensors')!r})
        k = next(k for k, v in w.items() if v.is_floating_point())
        w[k].view(-1)[0] = float("nan")
        save_file(w, {str(hf / 'model.safetensors')!r}, metadata={{"format": "pt"}})
    """)
    p = m.run("-m", "adaponder.cli.perplexity", hf, "--data", m.data["data"], "--window", "32", "--max-tokens", "2000")
    return refusal(p, "not all finite")


def _resume_with(m: Matrix, name: str, overrides: list[str], *must: str) -> tuple[str, str]:
    cfg, _ = m.copy_of_base(name)
    sets = [a for o in overrides for a in ("--set", o)]
    return refusal(m.pretrain(cfg, "--resume", "auto", *sets), *must)


def case_resume_other_weight_decay(m: Matrix) -> tuple[str, str]:
    return _resume_with(m, "resume-wd", ["optim.weight_decay=0.3"], "weight_decay", "0.3")


def case_resume_other_betas(m: Matrix) -> tuple[str, str]:
    return _resume_with(m, "resume-betas", ["optim.betas=[0.8,0.9]"], "betas")


def case_resume_other_data(m: Matrix) -> tuple[str, str]:
    """Other data of the same tokenizer and size: a prepared folder whose training tokens differ in order (two
    tokens swapped, ``meta.json`` updated to match, as preparing other text of the same length would give)."""
    import hashlib

    other = m.work / "other-data"
    if not other.is_dir():
        shutil.copytree(m.data["data"], other)
        meta = json.loads((other / "meta.json").read_text())
        shard = meta["splits"]["train"]["shards"][0]
        raw = bytearray((other / shard["file"]).read_bytes())
        i = next(i for i in range(200, len(raw) - 4, 2) if raw[i:i + 2] != raw[i + 2:i + 4])
        raw[i:i + 2], raw[i + 2:i + 4] = raw[i + 2:i + 4], raw[i:i + 2]
        (other / shard["file"]).write_bytes(bytes(raw))
        shard["sha256"] = hashlib.sha256(bytes(raw)).hexdigest()
        (other / "meta.json").write_text(json.dumps(meta, indent=1))
    return _resume_with(m, "resume-data", [f"data.path={other}"], "data differs", str(other))


def _config_text(m: Matrix, name: str, text: str | bytes) -> Path:
    folder = m.work / name
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "run.yaml"
    base = m.config(name).read_text()
    path.write_bytes(base.encode() + (text if isinstance(text, bytes) else text.encode()))
    return path


def case_config_duplicate_key(m: Matrix) -> tuple[str, str]:
    path = m.config("dup-key")
    text = path.read_text().replace("  lr: 0.003\n", "  lr: 0.003\n  lr: 0.1\n", 1)
    path.write_text(text)
    return refusal(m.pretrain(path), str(path), "lr")


def case_config_duplicate_section(m: Matrix) -> tuple[str, str]:
    path = _config_text(m, "dup-section", "optim:\n  lr: 0.1\n")
    return refusal(m.pretrain(path), str(path), "optim")


def case_config_non_utf8(m: Matrix) -> tuple[str, str]:
    path = _config_text(m, "non-utf8", b"# caf\xe9\n")
    return refusal(m.pretrain(path), str(path), "UTF-8")


def case_config_lr_inf(m: Matrix) -> tuple[str, str]:
    return refusal(m.pretrain(m.config("lr-inf"), "--set", "optim.lr=inf"), "optim.lr")


def case_config_deepspeed_batch_override(m: Matrix) -> tuple[str, str]:
    path = _config_text(m, "ds-batch", "")
    text = path.read_text().replace("deepspeed:\n", "deepspeed:\n  overrides:\n    train_micro_batch_size_per_gpu: 3\n", 1)
    path.write_text(text)
    return refusal(m.pretrain(path), "train_micro_batch_size_per_gpu")


def case_config_alias_bomb_in_overrides(m: Matrix) -> tuple[str, str]:
    path = m.config("alias-bomb")
    bomb = "".join(f"    l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9) if i else '1'}]\n" for i in range(9))
    text = path.read_text().replace("deepspeed:\n", "deepspeed:\n  overrides:\n" + bomb, 1)
    path.write_text(text)
    return refusal(m.pretrain(path, timeout=60), str(path), "alias")


def case_latest_outside_folder(m: Matrix) -> tuple[str, str]:
    cfg, run = m.copy_of_base("latest-outside")
    (run / "checkpoints" / "latest").write_text("../../other_run/checkpoints/step00000004")
    return refusal(m.pretrain(cfg, "--resume", "auto"), "latest")


def case_export_into_symlink(m: Matrix) -> tuple[str, str]:
    root = m.work / "export-link"
    shutil.rmtree(root, ignore_errors=True)
    (root / "target").mkdir(parents=True)
    (root / "link").symlink_to(root / "target")
    p = m.run("-m", "adaponder.cli.export_hf", m.base_run() / "checkpoints" / "step00000004", root / "link")
    if p.rc != 0:
        return refusal(p)
    leftovers = [x.name for x in root.iterdir() if x.name not in ("target", "link")]
    if not (root / "link").is_symlink() or not (root / "target" / "config.json").is_file() or leftovers:
        return "silent", f"link kept {(root / 'link').is_symlink()}, leftovers {leftovers}"
    return "recovered", "written into the link's target; the link kept; no leftovers"


def case_positions_forward(m: Matrix) -> tuple[str, str]:
    return raised(m.python(_api("model(torch.zeros(1, 40, dtype=torch.long))")), "40", "32")


def case_positions_generate(m: Matrix) -> tuple[str, str]:
    return raised(m.python(_api("model.generate(torch.zeros(1, 20, dtype=torch.long), max_new_tokens=20, "
                                "do_sample=False)")), "20", "32")


def case_float_input_ids(m: Matrix) -> tuple[str, str]:
    return raised(m.python(_api("model(torch.zeros(1, 8))")), "input_ids")


def case_3d_input_ids(m: Matrix) -> tuple[str, str]:
    return raised(m.python(_api("model(torch.zeros(1, 2, 8, dtype=torch.long))")), "input_ids")


def case_all_labels_ignored(m: Matrix) -> tuple[str, str]:
    return raised(m.python(_api("model(torch.zeros(1, 8, dtype=torch.long), "
                                "labels=torch.full((1, 8), -100))")), "labels")


def _eval_checkpoint(m: Matrix) -> Path:
    hf = m.work / "eval-ckpt"
    if not (hf / "config.json").is_file():
        m.python(f"""
            import sys; sys.path.insert(0, {str(REPO / 'tests')!r})
            from helpers_evaluation import tiny_model, tiny_tokenizer
            tiny_model().save_pretrained({str(hf)!r}); tiny_tokenizer().save_pretrained({str(hf)!r})
        """)
    return hf


def _piqa_eval(m: Matrix, name: str, records: list[str], labels: list[str]) -> Proc:
    root = m.work / name
    shutil.rmtree(root, ignore_errors=True)
    (root / "piqa").mkdir(parents=True)
    (root / "piqa" / "valid.jsonl").write_text("".join(r + "\n" for r in records))
    (root / "piqa" / "valid-labels.lst").write_text("".join(x + "\n" for x in labels))
    return m.run("-m", "adaponder.cli.lm_eval", _eval_checkpoint(m), "--tasks", "adaponder_piqa", "--limit", "2",
                 "--device", "cpu", "--metadata", json.dumps({"adaponder_eval_data": str(root)}))


_PIQA = [json.dumps({"goal": f"goal {i}", "sol1": "a", "sol2": "b"}) for i in range(3)]


def case_eval_task_not_json(m: Matrix) -> tuple[str, str]:
    p = _piqa_eval(m, "eval-not-json", [_PIQA[0], _PIQA[1], "[1, 2"], ["0", "1", "0"])
    return refusal(p, "valid.jsonl:3", "not a JSON line")


def case_eval_task_missing_key(m: Matrix) -> tuple[str, str]:
    p = _piqa_eval(m, "eval-missing-key", [_PIQA[0], json.dumps({"goal": "g", "sol1": "a"})], ["0", "1"])
    return refusal(p, "valid.jsonl:2", "sol2")


def case_eval_task_empty(m: Matrix) -> tuple[str, str]:
    return refusal(_piqa_eval(m, "eval-empty", [], []), "valid.jsonl", "empty")


def case_eval_label_out_of_range(m: Matrix) -> tuple[str, str]:
    p = _piqa_eval(m, "eval-label", _PIQA, ["0", "2", "1"])
    return refusal(p, "valid-labels.lst:2", "out of range")


def case_finetune_small_vocab_without_tokenizer(m: Matrix) -> tuple[str, str]:
    glue = os.environ.get("ADAPONDER_GLUE_DIR")
    if not glue or not Path(glue, "RTE").is_dir():
        return "skipped", "no GLUE data (set ADAPONDER_GLUE_DIR)"
    ckpt = m.work / "small-vocab"
    m.python(f"""
        import sys; sys.path.insert(0, {str(REPO / 'tests')!r})
        from helpers_evaluation import tiny_model
        tiny_model(hidden_size=32, num_hidden_layers=1, intermediate_size=64, vocab_size=1000).save_pretrained(
            {str(ckpt)!r})
    """)
    p = m.run("-m", "adaponder.cli.finetune_glue", "--config", "configs/glue/rte.yaml", "--init", ckpt,
              "--data-dir", glue, "--output", m.work / "small-vocab-run", "--set", "train.max_steps=1", cwd=REPO)
    return refusal(p, "1000", "tokenizer")


def _tmpfs(path: Path, size: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["umount", str(path)], capture_output=True)
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True).returncode == 0


def case_disk_full_checkpoint(m: Matrix) -> tuple[str, str]:
    disk = m.work / "disk-ckpt"
    if os.geteuid() != 0 or not _tmpfs(disk, "400k"):
        return "skipped", "mounting a small tmpfs needs root"
    try:
        cfg = m.config("disk-ckpt-cfg", out_dir=disk / "run")
        p = m.pretrain(cfg)
        return refusal(p, "No space left on device", str(disk / "run"))
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)


def _disk_full(m: Matrix, name: str, size: str, *args) -> tuple[str, str]:
    """Run ``args`` writing into ``DISK/out`` on a full ``size`` tmpfs: one clear error, nothing left behind."""
    disk = m.work / name
    if os.geteuid() != 0 or not _tmpfs(disk, size):
        return "skipped", "mounting a small tmpfs needs root"
    try:
        verdict = refusal(m.run(*args, disk / "out"), "No space left on device")
        leftovers = [x.name for x in disk.iterdir()]
        return (verdict if not leftovers or verdict[0] != "clear error"
                else ("unclear", f"{verdict[1]}; left behind {leftovers}"))
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)


def case_disk_full_prepare(m: Matrix) -> tuple[str, str]:
    return _disk_full(m, "disk-prepare", "64k", "-m", "adaponder.cli.prepare", m.data["corpus"], "--tokenizer",
                      m.data["tokenizer"], "-j", "1", "--no-progress", "-o")


def case_disk_full_export(m: Matrix) -> tuple[str, str]:
    return _disk_full(m, "disk-export", "64k", "-m", "adaponder.cli.export_hf",
                      m.base_run() / "checkpoints" / "step00000004")


# -- the edges: silent acceptance and unclear refusals (section Q) ---------------------------------------------
def _unchanged(before: dict, after: dict, verdict: tuple[str, str]) -> tuple[str, str]:
    if verdict[0] == "clear error" and before != after:
        changed = sorted(set(before.items()) ^ set(after.items()))[:3]
        return "data loss", f"{verdict[1]}; but the disk changed: {changed}"
    return verdict


def _listing(root: Path) -> dict:
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.rglob("*")) if p.is_file()} \
        if root.exists() else {}


def _with_data(cfg: Path, **values) -> Path:
    """``cfg`` with these ``data:`` values (``Matrix.config`` takes the toy data's own)."""
    import yaml

    raw = yaml.safe_load(cfg.read_text())
    raw["data"].update(values)
    cfg.write_text(yaml.safe_dump(raw, sort_keys=False))
    return cfg


def case_edge_two_studies(m: Matrix) -> tuple[str, str]:
    """A second study on a study folder whose first study is at work (a process holding the study lock)."""
    root = m.work / "edge-study"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    holder = m.start("-c", "import sys, time; from adaponder.run_lock import lock_folder; "
                     f"lock_folder({str(root / 'runs')!r}, 'study folder'); print('held', flush=True); time.sleep(60)")
    holder.stdout.readline()
    try:
        before = _listing(root)
        p = m.run(REPO / "launch" / "study.py", "--config", REPO / "configs/study/cpu.yaml", "--profile", "quick",
                  "--set", f"study.runs_dir={root / 'runs'}", "--set", f"study.results_dir={root / 'results'}",
                  "--set", f"study.report={root / 'study.md'}", cwd=root)
        return _unchanged(before, _listing(root), refusal(p, "study folder", "in use by another job",
                                                          f"PID {holder.pid}"))
    finally:
        holder.kill()
        holder.wait()


def case_edge_prepare_over_live_run(m: Matrix) -> tuple[str, str]:
    """adaponder-prepare --overwrite on the data folder of a training run that is still running."""
    data = m.work / "edge-live-data" / "prepared"
    shutil.rmtree(data.parent, ignore_errors=True)
    shutil.copytree(m.data["data"], data)
    cfg = _with_data(m.config("edge-live-run", train={"steps": 1500}, checkpoint={"every": 500},
                              logging={"every": 50}), path=str(data))
    run = cfg.parent / "run"
    shutil.rmtree(run, ignore_errors=True)
    first = m.start("-m", "adaponder.cli.pretrain", "--config", cfg)
    deadline = time.time() + m.timeout
    while time.time() < deadline and not (run / "metrics.jsonl").is_file() and first.poll() is None:
        time.sleep(0.1)
    before = _listing(data)
    p = m.run("-m", "adaponder.cli.prepare", m.data["corpus"], "-o", data, "--tokenizer", m.data["tokenizer"],
              "-j", "1", "--no-progress", "--overwrite")
    running = first.poll() is None
    first.kill()
    first.communicate()
    if not running:
        return "unclear", "the run ended before the preparation started: lengthen it"
    after = {k: v for k, v in _listing(data).items() if ".adaponder.readers" not in k}
    before = {k: v for k, v in before.items() if ".adaponder.readers" not in k}
    return _unchanged(before, after, refusal(p, "is in use", f"run folder {run}"))


def case_edge_shard_edited(m: Matrix) -> tuple[str, str]:
    """A shard edited after preparation (two tokens swapped), meta.json unchanged: a resume re-hashes it."""
    cfg, run = m.copy_of_base("edge-shard")
    data = m.work / "edge-shard" / "prepared"
    shutil.rmtree(data, ignore_errors=True)
    shutil.copytree(m.data["data"], data)
    text = cfg.read_text().replace(str(m.data["data"]), str(data))
    cfg.write_text(text)
    shard = data / "train-00000.bin"
    raw = bytearray(shard.read_bytes())
    raw[100:102], raw[102:104] = raw[102:104], raw[100:102]
    shard.write_bytes(bytes(raw))
    before = _listing(run)
    return _unchanged(before, _listing(run), refusal(m.pretrain(cfg, "--resume", "auto"), str(shard),
                                                     "changed after preparation"))


def _edge_config(m: Matrix, name: str, *sets: str, must: tuple[str, ...]) -> tuple[str, str]:
    cfg = m.config(name, train={"steps": 8})
    run = cfg.parent / "run"
    shutil.rmtree(run, ignore_errors=True)
    verdict = refusal(m.pretrain(cfg, *[a for s in sets for a in ("--set", s)]), *must)
    return ("data loss", f"{verdict[1]}; {run} was created") if run.exists() else verdict


def case_edge_lr_warmup(m: Matrix) -> tuple[str, str]:
    return _edge_config(m, "edge-warmup", "optim.warmup=20", must=("optim.warmup", "20", "8 steps"))


def case_edge_ponder_start(m: Matrix) -> tuple[str, str]:
    return _edge_config(m, "edge-s0", "schedule.s0=9", "schedule.s1=10", must=("schedule.s0", "never be applied"))


def case_edge_stop_at(m: Matrix) -> tuple[str, str]:
    return _edge_config(m, "edge-stop", "train.stop_at=12", must=("train.stop_at", "12"))


def case_edge_deepspeed_override_key(m: Matrix) -> tuple[str, str]:
    return _edge_config(m, "edge-ds-key", "deepspeed.overrides={zero_optimization: {bogus_key: 1}}",
                        must=("deepspeed.overrides.zero_optimization.bogus_key", "unknown DeepSpeed key"))


def case_edge_list_does_not_parse(m: Matrix) -> tuple[str, str]:
    return _edge_config(m, "edge-list", "optim.betas=[0.9,0.95", must=("optim.betas", "does not parse as a list"))


def case_edge_small_split_warns(m: Matrix) -> tuple[str, str]:
    cfg = _with_data(m.config("edge-small", train={"steps": 2, "micro_batch": 64, "grad_accum": 64}), seq_len=63)
    shutil.rmtree(cfg.parent / "run", ignore_errors=True)
    p = m.pretrain(cfg)
    if p.rc != 0:
        return refusal(p)
    warned = [ln for ln in p.err.splitlines() if ln.startswith("warning: data.path") and "fewer than one global" in ln]
    return ("clear error", f"exit 0 with {warned[0][:200]}") if warned else ("silent", "no warning")


def case_edge_truncated_safetensors(m: Matrix) -> tuple[str, str]:
    hf = m.work / "edge-trunc"
    shutil.rmtree(hf, ignore_errors=True)
    shutil.copytree(_eval_checkpoint(m), hf)
    weights = hf / "model.safetensors"
    os.truncate(weights, weights.stat().st_size // 2)
    return refusal(m.run("-m", "adaponder.cli.perplexity", hf, "--data", m.data["corpus"]), str(weights),
                   "truncated")


def case_edge_tau_list(m: Matrix) -> tuple[str, str]:
    return refusal(m.run("-m", "adaponder.cli.dial", _eval_checkpoint(m), "--data", m.data["corpus"], "--taus",
                         "0.5,x"), "--taus", "'x'", "expected")


def case_edge_bench_gamma_0(m: Matrix) -> tuple[str, str]:
    return refusal(m.run(REPO / "eval" / "bench_speculative.py", "--shapes", "tiny:adaponder", "--gammas", "0"),
                   "--gammas", "γ 0", "expected")


def case_edge_bench_batch_0(m: Matrix) -> tuple[str, str]:
    return refusal(m.run(REPO / "eval" / "bench_inference.py", "--size", "tiny", "--batches", "0"),
                   "--batches", "batch size 0", "expected")


def case_edge_lm_eval_task(m: Matrix) -> tuple[str, str]:
    return refusal(m.run("-m", "adaponder.cli.lm_eval", _eval_checkpoint(m), "--tasks", "adaponder_piqaa",
                         "--limit", "1", "--device", "cpu"), "adaponder_piqaa", "did you mean")


def case_edge_draft_tokens(m: Matrix) -> tuple[str, str]:
    return raised(m.python("""
        from adaponder.evaluation.lm_eval_model import _as_int
        try:
            print("ACCEPTED", _as_int("2.5", "speculative_draft_tokens"))
        except ValueError as err:
            print("RAISED", type(err).__name__ + ":", err)
    """), "speculative_draft_tokens=2.5", "not an integer")


def case_edge_labels_length(m: Matrix) -> tuple[str, str]:
    return raised(m.python(_api("model(torch.zeros(2, 8, dtype=torch.long), "
                                "labels=torch.zeros(2, 7, dtype=torch.long))")), "labels", "(2, 8)", "(2, 7)")


def case_edge_glue_preset_name(m: Matrix) -> tuple[str, str]:
    p = m.run("-m", "adaponder.cli.finetune_glue", "--config", "rte", "--init", "NOPE-missing", "--output",
              m.work / "edge-glue")
    if "config file rte does not exist" in p.err:
        return "unclear", "the preset name was refused"
    return "recovered", f"the preset was found (then exit {p.rc}: {p.last_error[:120]})"


def case_edge_out_dir_is_a_file(m: Matrix) -> tuple[str, str]:
    target = m.work / "edge-file"
    target.write_text("x")
    return _edge_config(m, "edge-file-cfg", f"train.out_dir={target}", must=(str(target), "a file, not a folder"))


def case_edge_difficulty_foreign_labels(m: Matrix) -> tuple[str, str]:
    root = m.work / "edge-labels"
    shutil.rmtree(root, ignore_errors=True)
    m.python(f"""
        import shutil, sys
        sys.path.insert(0, {str(REPO / 'tests')!r})
        from adaponder.data.reasoning import MultiHopSpec, write_multihop
        from adaponder.train.export import save_tokenizer
        from helpers_evaluation import tiny_model
        root = __import__("pathlib").Path({str(root)!r})
        for seed in (1, 2):
            write_multihop(root / f"c{{seed}}", MultiHopSpec(symbols=24, max_hops=3, filler_symbols=5, queries=6,
                           doc_tokens=32, train_docs=16, val_docs=6, seed=seed))
        tiny_model().save_pretrained(root / "ckpt")
        save_tokenizer(root / "ckpt", str(root / "c1" / "tokenizer.json"))
        shutil.copy(root / "c2" / "val.labels.npy", root / "c1" / "val.labels.npy")
    """)
    return refusal(m.run("-m", "adaponder.cli.difficulty", root / "ckpt", "--data", root / "c1"),
                   "val.labels.npy", "do not belong")


# -- checked at the door: loads on a local checkpoint, rotation, Ctrl-C, every bad argument (section R) -------------
def case_door_dial_local_checkpoint(m: Matrix) -> tuple[str, str]:
    """``adaponder dial`` on a local checkpoint (it failed on every one: an argument passed by position)."""
    p = m.run("-m", "adaponder.cli.main", "dial", _eval_checkpoint(m), "--data", m.data["corpus"], "--taus",
              "0.01,0.1", "--window", "64", "--max-tokens", "512")
    if p.rc != 0:
        return refusal(p)
    rows = [ln for ln in p.out.splitlines() if ln.startswith("| 0.01 ") or ln.startswith("| 0.1 ")]
    return ("recovered", f"exit 0, the τ rows {len(rows)} of 2") if len(rows) == 2 else ("silent", "no τ rows")


# A pretraining run whose first deletion of an old checkpoint is killed (SIGKILL) after one file: the state a kill
# in the middle of shutil.rmtree leaves.
_KILL_IN_ROTATION = """
import os, shutil, signal, sys
real = shutil.rmtree
def rmtree(path, *args, **kwargs):
    state = os.path.join(path, "trainer_state.json")
    if os.path.isfile(state):
        os.unlink(state)
        os.kill(os.getpid(), signal.SIGKILL)
    return real(path, *args, **kwargs)
shutil.rmtree = rmtree
from adaponder.cli.pretrain import main
sys.exit(main(sys.argv[1:]))
"""


def case_door_rotation_kill(m: Matrix) -> tuple[str, str]:
    cfg = m.config("door-rotation", train={"steps": 6}, checkpoint={"every": 2, "keep": 1})
    run = cfg.parent / "run"
    shutil.rmtree(run, ignore_errors=True)
    killed = m.run("-c", _KILL_IN_ROTATION, "--config", cfg)
    if killed.rc != -9:
        return "unclear", f"the run was not killed in the rotation (exit {killed.rc}): {killed.last_error[:200]}"
    ck = run / "checkpoints"
    half = [p.name for p in ck.iterdir() if p.name.startswith("step") and not (p / "trainer_state.json").is_file()]
    if half:
        return "data loss", f"after the kill: {half} named like checkpoints, incomplete"
    p = m.pretrain(cfg, "--resume", "auto")
    if p.rc != 0:
        return refusal(p)
    left = [p.name for p in ck.iterdir() if p.name.startswith((".deleting-", ".tmp-"))]
    ok, what = _loadable(m, ck)
    if left or not ok:
        return "data loss", f"leftovers {left}; {what}"
    return "recovered", f"killed while deleting step 2: no half checkpoint; resumed, finished; {what}"


# Ctrl-C twice in the save of step 4 (SIGINT sent by the process to itself once the files are written).
_CTRL_C_IN_SAVE = """
import os, re, signal, sys
import adaponder.train.checkpoint as C
real = C.hash_files
def hash_files(folder, names):
    if re.match(r"^\\.tmp-step00000004-", folder.name):
        for _ in range({count}):
            os.kill(os.getpid(), signal.SIGINT)
    return real(folder, names)
C.hash_files = hash_files
from adaponder.cli.pretrain import main
sys.exit(main(sys.argv[1:]))
"""


def _door_ctrl_c(m: Matrix, name: str, count: int, latest: str, *must: str) -> tuple[str, str]:
    cfg = m.config(name, train={"steps": 8}, checkpoint={"every": 2})
    shutil.rmtree(cfg.parent / "run", ignore_errors=True)
    p = m.run("-c", _CTRL_C_IN_SAVE.format(count=count), "--config", cfg)
    if p.rc is None:
        return "hang", "killed at the time limit"
    if "Traceback" in p.err:
        return "traceback", p.err.strip().splitlines()[-1][:300]
    text = p.out + p.err
    missing = [x for x in must if x not in text]
    ck = cfg.parent / "run" / "checkpoints"
    named = (ck / "latest").read_text().strip() if (ck / "latest").is_file() else None
    if p.rc != 130 or missing or named != latest:
        return "unclear", f"exit {p.rc}; missing {missing}; latest {named}"
    ok, what = _loadable(m, ck)
    return ("recovered", f"exit 130, one line; latest {latest}; {what}") if ok else ("data loss", what)


def case_door_ctrl_c_twice_while_saving(m: Matrix) -> tuple[str, str]:
    return _door_ctrl_c(m, "door-ctrl-c-2", 2, "step00000005", "waiting for it to finish", "received SIGINT: saved")


def case_door_ctrl_c_three_times_while_saving(m: Matrix) -> tuple[str, str]:
    return _door_ctrl_c(m, "door-ctrl-c-3", 3, "step00000002", "stopped at once by Ctrl-C at step 4")


def _door_refusal(m: Matrix, name: str, args: tuple, *must: str) -> tuple[str, str]:
    """A command that must refuse: one line naming ``must``, and nothing written under its folder."""
    root = m.work / name
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    before = _listing(root)
    p = m.run(*[str(a).replace("{root}", str(root)) for a in args], cwd=root)
    return _unchanged(before, _listing(root), refusal(p, *must))


def case_door_eval_limit_negative(m: Matrix) -> tuple[str, str]:
    return _door_refusal(m, "door-limit", ("-m", "adaponder.cli.lm_eval", _eval_checkpoint(m), "--tasks",
                                           "adaponder_piqa", "--limit", "-1", "--device", "cpu", "--output_path",
                                           "{root}/results"), "--limit -1", "expected a number of examples")


def case_door_eval_empty_document(m: Matrix) -> tuple[str, str]:
    records = [_PIQA[0], json.dumps({"goal": "", "sol1": "a", "sol2": "b"}), _PIQA[2]]
    return refusal(_piqa_eval(m, "door-empty-doc", records, ["0", "1", "0"]), "valid.jsonl:2", "goal is empty")


def _door_ppl(m: Matrix, name: str, *args: str, must: tuple[str, ...]) -> tuple[str, str]:
    return _door_refusal(m, name, ("-m", "adaponder.cli.perplexity", _eval_checkpoint(m), "--data", m.data["corpus"],
                                   "--json", "{root}/r.json", *args), *must)


def case_door_perplexity_passes_beyond_k(m: Matrix) -> tuple[str, str]:
    return _door_ppl(m, "door-passes", "--passes", "9", must=("--passes 9", "expected 1 <= --passes <= 4"))


def case_door_perplexity_target_beyond_k(m: Matrix) -> tuple[str, str]:
    return _door_ppl(m, "door-target", "--exit-rule", "uniform", "--target-mean-exit", "9",
                     must=("--target-mean-exit 9", "expected 1 <= --target-mean-exit <= 4"))


def case_door_perplexity_max_tokens_0(m: Matrix) -> tuple[str, str]:
    return _door_ppl(m, "door-max-tokens", "--max-tokens", "0", must=("--max-tokens 0", "tokens >= 1"))


def case_door_bench_size_unknown(m: Matrix) -> tuple[str, str]:
    return _door_refusal(m, "door-bench-size", (REPO / "eval" / "bench_inference.py", "--size", "7b", "--json",
                                                "{root}/rows.json"), "--size '7b'", "no such Pythia size")


def case_door_bench_checkpoint_missing(m: Matrix) -> tuple[str, str]:
    return _door_refusal(m, "door-bench-ckpt", ("-m", "adaponder.cli.main", "bench", "speculative", "--checkpoint",
                                                "{root}/no-such/hf"), "--checkpoint",
                         "no such folder (expected a checkpoint folder")


def case_door_reasoning_max_hops_0(m: Matrix) -> tuple[str, str]:
    return _door_refusal(m, "door-hops", ("-m", "adaponder.cli.reasoning_data", "{root}/corpus", "--max-hops", "0"),
                         "max_hops: 0")


def case_door_reasoning_symbols_absurd(m: Matrix) -> tuple[str, str]:
    return _door_refusal(m, "door-symbols", ("-m", "adaponder.cli.reasoning_data", "{root}/corpus", "--symbols",
                                             "1000000"), "symbols: 1000000", "one-hop queries")


def case_door_build_lock_timeout(m: Matrix) -> tuple[str, str]:
    cfg = m.config("door-lock-timeout")
    run = cfg.parent / "run"
    shutil.rmtree(run, ignore_errors=True)
    p = m.run("-m", "adaponder.cli.pretrain", "--config", cfg, env={"ADAPONDER_BUILD_LOCK_TIMEOUT": "soon"})
    verdict = refusal(p, "ADAPONDER_BUILD_LOCK_TIMEOUT='soon'", "expected a positive number")
    return ("data loss", f"{verdict[1]}; {run} was created") if run.exists() else verdict


def case_door_flops_dict(m: Matrix) -> tuple[str, str]:
    return raised(m.python(_api("model.flops_per_token({1: 3, 2: 5})")), "exit_pass", "got dict")


# -- calibration and studies that notice what changed (section S) -------------------------------------------------
def _foreign_tokenizer_checkpoint(m: Matrix) -> Path:
    """A ponderlm with consistency heads of the toy data's vocabulary, saved without a tokenizer: it evaluates with
    the bundled Pythia tokenizer, not the toy BPE the toy data was prepared with."""
    hf = m.work / "notice-ckpt"
    if not (hf / "config.json").is_file():
        m.python(f"""
            import sys; sys.path.insert(0, {str(REPO / 'tests')!r})
            from helpers_evaluation import tiny_model
            from helpers_train import TINY_VOCAB
            tiny_model(mode="ponderlm", passes=2, consistency_heads=True, hidden_size=32, intermediate_size=64,
                       vocab_size=TINY_VOCAB).save_pretrained({str(hf)!r})
        """)
    return hf


def _notice_foreign(m: Matrix, *command: str) -> tuple[str, str]:
    ckpt = _foreign_tokenizer_checkpoint(m)
    before = _listing(ckpt)
    p = m.run("-m", "adaponder.cli.main", command[0], ckpt, "--data", m.data["data"], *command[1:])
    return _unchanged(before, _listing(ckpt), refusal(p, str(m.data["data"]), "the model's tokenizer",
                                                       "is not the corpus's"))


def case_notice_calibrate_foreign_tokenizer(m: Matrix) -> tuple[str, str]:
    return _notice_foreign(m, "calibrate", "--split", "val", "--test-split", "val")


def case_notice_perplexity_foreign_tokenizer(m: Matrix) -> tuple[str, str]:
    return _notice_foreign(m, "perplexity", "--packing", "stream", "--window", "32")


def case_notice_calibrate_ctrl_c(m: Matrix) -> tuple[str, str]:
    """Ctrl-C while ``adaponder calibrate`` runs (its progress bar shown): one line, exit 130, nothing written."""
    import signal
    import threading

    ckpt = m.work / "notice-ctrl-c" / "ckpt"
    shutil.rmtree(ckpt.parent, ignore_errors=True)
    shutil.copytree(_foreign_tokenizer_checkpoint(m), ckpt)
    m.python(f"""
        from adaponder.train.export import save_tokenizer
        save_tokenizer({str(ckpt)!r}, {str(m.data["tokenizer"])!r})
    """)
    before = _listing(ckpt)
    proc = m.start("-m", "adaponder.cli.main", "calibrate", ckpt, "--data", m.data["data"], "--split", "val",
                   "--test-split", "val", "--window", "8", "--batch-size", "1")
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.extend(iter(lambda: proc.stderr.read(1), "")), daemon=True)
    reader.start()
    t0 = time.time()
    while "calibrating" not in "".join(err) and proc.poll() is None and time.time() - t0 < m.timeout:
        time.sleep(0.1)
    if proc.poll() is not None:
        return "unclear", f"calibrate ended (exit {proc.returncode}) before the progress bar: {''.join(err)[-300:]!r}"
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        return "hang", "no exit within 60 s of Ctrl-C"
    reader.join(timeout=10)
    text = "".join(err)
    if "Traceback" in text:
        return "traceback", text.strip().splitlines()[-1][:300]
    lines = [ln.strip() for ln in text.replace("\r", "\n").splitlines() if "Ctrl-C" in ln]
    if _listing(ckpt) != before:
        return "data loss", f"exit {proc.returncode}; the checkpoint folder changed"
    if proc.returncode != 130 or len(lines) != 1:
        return "unclear", f"exit {proc.returncode}; lines {lines}"
    return "clear error", f"exit 130: {lines[0]}"


def _notice_study(m: Matrix, root: Path, *extra: str, start: bool = False):
    args = [REPO / "launch" / "study.py", "--config", REPO / "configs/study/cpu.yaml", "--profile", "quick",
            "--corpus", m.data["corpus"]]
    for s in (f"study.runs_dir={root / 'runs'}", f"study.results_dir={root / 'results'}",
              f"study.report={root / 'study.md'}", "data.vocab=300", "base.model.vocab_size=300",
              "study.only=[adaponder-paper]", "study.repeat_seed=null", "base.train.tokens=8192",
              "base.checkpoint.every=4", "eval.max_tokens_per_doc=256", *extra):
        args += ["--set", s]
    if start:  # its own process group: the kill takes the study and its training child together
        return subprocess.Popen([sys.executable, *map(str, args)], env=m.env, cwd=root, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
    return m.run(*args, cwd=root)


def case_notice_study_killed_arm(m: Matrix) -> tuple[str, str]:
    """A study SIGKILLed (with its training child) once the arm's step-4 checkpoint exists, then run again."""
    import signal

    root = m.work / "notice-study"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    ck = root / "runs" / "adaponder-paper-s1234" / "checkpoints"
    proc = _notice_study(m, root, start=True)
    t0 = time.time()
    while not (ck / "step00000004" / "trainer_state.json").is_file() and proc.poll() is None \
            and time.time() - t0 < m.timeout:
        time.sleep(0.05)
    if proc.poll() is not None:
        return "unclear", f"the study ended (exit {proc.returncode}) before its first checkpoint"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    steps = sorted(int(p.name[4:]) for p in ck.glob("step*") if (p / "trainer_state.json").is_file())
    if (root / "results" / "adaponder-paper-s1234.json").is_file() or not steps:
        return "unclear", f"the arm finished before the kill, or left no checkpoint ({steps})"
    p = _notice_study(m, root)
    if p.rc != 0:
        return refusal(p)
    said = f"resumed from step {steps[-1]} of 16"
    if said not in p.out or "started from step 0" in p.out:
        line = next((ln for ln in p.out.splitlines() if ln.startswith("== training")), "no training line")
        return "silent", f"killed with checkpoints at steps {steps}; the rerun said {line[:200]!r}"
    if not (root / "results" / "adaponder-paper-s1234.json").is_file():
        return "data loss", "the rerun wrote no result"
    return "recovered", f"killed with checkpoints at steps {steps}; the rerun: {said}, the result written"


def case_notice_study_eval_edit(m: Matrix) -> tuple[str, str]:
    """The study's eval section edited (a τ added to the dial) after the arm's result was written."""
    root = m.work / "notice-study"
    result = root / "results" / "adaponder-paper-s1234.json"
    if not result.is_file():
        root.mkdir(parents=True, exist_ok=True)
        first = _notice_study(m, root)
        if first.rc != 0:
            return refusal(first)
    p = _notice_study(m, root, "eval.taus=[1.0e-4, 0.05, 0.1, 0.3]")
    if p.rc != 0:
        return refusal(p)
    taus = [row["tau"] for row in json.loads(result.read_text()).get("tau_dial", [])]
    if "re-evaluating adaponder-paper-s1234" not in p.out or "eval.taus:" not in p.out or taus != [1e-4, 0.05, 0.1, 0.3]:
        return "silent", f"the rerun's dial {taus}; said re-evaluating: {'re-evaluating' in p.out}"
    if "== training" in p.out:
        return "unclear", "the arm was trained again for an evaluation change"
    return "recovered", f"re-evaluated, saying so; the dial now {taus}"


CASES: list[tuple[str, str, Callable[[Matrix], tuple[str, str]]]] = [
    ("lock-two-runs", "two jobs on one output folder", case_lock_two_runs),
    ("lock-two-prepares", "two jobs on one output folder", case_lock_two_prepares),
    ("nonfinite-resume-explicit", "bad weights rotate good checkpoints away", case_nonfinite_resume_explicit),
    ("nonfinite-resume-auto", "bad weights rotate good checkpoints away", case_nonfinite_resume_auto_keeps_last_good),
    ("nonfinite-export", "bad weights rotate good checkpoints away", case_nonfinite_export),
    ("nonfinite-exported-perplexity", "silent", case_nonfinite_exported_weights_perplexity),
    ("resume-other-weight-decay", "silent", case_resume_other_weight_decay),
    ("resume-other-betas", "silent", case_resume_other_betas),
    ("resume-other-data", "silent", case_resume_other_data),
    ("config-duplicate-key", "silent", case_config_duplicate_key),
    ("config-duplicate-section", "silent", case_config_duplicate_section),
    ("config-lr-inf", "silent", case_config_lr_inf),
    ("positions-forward", "silent", case_positions_forward),
    ("positions-generate", "silent", case_positions_generate),
    ("latest-outside-folder", "silent", case_latest_outside_folder),
    ("eval-label-out-of-range", "silent", case_eval_label_out_of_range),
    ("export-into-symlink", "silent", case_export_into_symlink),
    ("disk-full-checkpoint", "tracebacks", case_disk_full_checkpoint),
    ("disk-full-prepare", "tracebacks", case_disk_full_prepare),
    ("disk-full-export", "tracebacks", case_disk_full_export),
    ("config-non-utf8", "tracebacks", case_config_non_utf8),
    ("config-deepspeed-batch-override", "tracebacks", case_config_deepspeed_batch_override),
    ("eval-task-not-json", "tracebacks", case_eval_task_not_json),
    ("eval-task-missing-key", "tracebacks", case_eval_task_missing_key),
    ("eval-task-empty", "tracebacks", case_eval_task_empty),
    ("finetune-small-vocab", "tracebacks", case_finetune_small_vocab_without_tokenizer),
    ("float-input-ids", "tracebacks", case_float_input_ids),
    ("3d-input-ids", "tracebacks", case_3d_input_ids),
    ("all-labels-ignored", "tracebacks", case_all_labels_ignored),
    ("alias-bomb-in-overrides", "hang", case_config_alias_bomb_in_overrides),
    ("edge-two-studies", "edges: silent", case_edge_two_studies),
    ("edge-prepare-over-live-run", "edges: silent", case_edge_prepare_over_live_run),
    ("edge-shard-edited", "edges: silent", case_edge_shard_edited),
    ("edge-lr-warmup", "edges: silent", case_edge_lr_warmup),
    ("edge-ponder-start", "edges: silent", case_edge_ponder_start),
    ("edge-stop-at", "edges: silent", case_edge_stop_at),
    ("edge-small-split-warns", "edges: silent", case_edge_small_split_warns),
    ("edge-difficulty-foreign-labels", "edges: silent", case_edge_difficulty_foreign_labels),
    ("edge-deepspeed-override-key", "edges: unclear", case_edge_deepspeed_override_key),
    ("edge-lm-eval-task", "edges: unclear", case_edge_lm_eval_task),
    ("edge-truncated-safetensors", "edges: unclear", case_edge_truncated_safetensors),
    ("edge-tau-list", "edges: unclear", case_edge_tau_list),
    ("edge-bench-gamma-0", "edges: unclear", case_edge_bench_gamma_0),
    ("edge-bench-batch-0", "edges: unclear", case_edge_bench_batch_0),
    ("edge-draft-tokens", "edges: unclear", case_edge_draft_tokens),
    ("edge-labels-length", "edges: unclear", case_edge_labels_length),
    ("edge-glue-preset-name", "edges: unclear", case_edge_glue_preset_name),
    ("edge-out-dir-is-a-file", "edges: unclear", case_edge_out_dir_is_a_file),
    ("edge-list-does-not-parse", "edges: unclear", case_edge_list_does_not_parse),
    ("door-dial-local-checkpoint", "door: regression", case_door_dial_local_checkpoint),
    ("door-rotation-kill", "door: half checkpoint", case_door_rotation_kill),
    ("door-ctrl-c-twice-while-saving", "door: tracebacks", case_door_ctrl_c_twice_while_saving),
    ("door-ctrl-c-three-times-while-saving", "door: tracebacks", case_door_ctrl_c_three_times_while_saving),
    ("door-eval-limit-negative", "door: tracebacks", case_door_eval_limit_negative),
    ("door-perplexity-passes-beyond-k", "door: tracebacks", case_door_perplexity_passes_beyond_k),
    ("door-perplexity-target-beyond-k", "door: tracebacks", case_door_perplexity_target_beyond_k),
    ("door-bench-size-unknown", "door: tracebacks", case_door_bench_size_unknown),
    ("door-bench-checkpoint-missing", "door: tracebacks", case_door_bench_checkpoint_missing),
    ("door-reasoning-max-hops-0", "door: tracebacks", case_door_reasoning_max_hops_0),
    ("door-build-lock-timeout", "door: tracebacks", case_door_build_lock_timeout),
    ("door-perplexity-max-tokens-0", "door: silent", case_door_perplexity_max_tokens_0),
    ("door-eval-empty-document", "door: silent", case_door_eval_empty_document),
    ("door-reasoning-symbols-absurd", "door: silent", case_door_reasoning_symbols_absurd),
    ("door-flops-dict", "door: silent", case_door_flops_dict),
    ("notice-calibrate-foreign-tokenizer", "notice: silent", case_notice_calibrate_foreign_tokenizer),
    ("notice-perplexity-foreign-tokenizer", "notice: silent", case_notice_perplexity_foreign_tokenizer),
    ("notice-calibrate-ctrl-c", "notice: traceback", case_notice_calibrate_ctrl_c),
    ("notice-study-killed-arm", "notice: silent", case_notice_study_killed_arm),
    ("notice-study-eval-edit", "notice: silent", case_notice_study_eval_edit),
]


def run_case(m: Matrix, name: str, finding: str, fn) -> Outcome:
    t0 = time.time()
    try:
        outcome, detail = fn(m)
    except subprocess.TimeoutExpired:
        outcome, detail = "hang", "killed at the time limit"
    return Outcome(name, finding, outcome, detail, round(time.time() - t0, 1))


def write_report(results: list[Outcome], out: Path) -> Path:
    counts = {c: sum(r.outcome == c for r in results) for c in CLASSES}
    lines = ["# Reliability matrix", "", "`python eval/reliability_matrix.py` — each case run as a user meets it.", "",
             "| " + " | ".join(CLASSES) + " |", "|" + "---|" * len(CLASSES),
             "| " + " | ".join(str(counts[c]) for c in CLASSES) + " |", "",
             "| case | finding | outcome | detail | s |", "|---|---|---|---|---|"]
    for r in results:
        detail = r.detail.replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {r.case} | {r.finding} | **{r.outcome}** | {detail} | {r.seconds:g} |")
    path = out / "matrix.md"
    path.write_text("\n".join(lines) + "\n")
    with open(out / "matrix.jsonl", "w") as f:
        for r in results:
            f.write(json.dumps(asdict(r)) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="runs/reliability-matrix", help="work and report folder (emptied first)")
    ap.add_argument("--only", default="", help="comma-separated substrings of case names")
    ap.add_argument("--timeout", type=float, default=300, help="time limit of one command, seconds")
    ap.add_argument("--list", action="store_true", help="list the cases and exit")
    args = ap.parse_args(argv)
    chosen = [c for c in CASES if not args.only or any(s in c[0] for s in args.only.split(","))]
    if args.list:
        print("\n".join(f"{name:34s} {finding}" for name, finding, _ in chosen))
        return 0
    out = Path(args.out).resolve()
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    m = Matrix(out / "work", args.timeout)
    results = []
    for i, (name, finding, fn) in enumerate(chosen, 1):
        r = run_case(m, name, finding, fn)
        results.append(r)
        print(f"[{i}/{len(chosen)}] {name}: {r.outcome} ({r.seconds:g} s) — {r.detail[:160]}", flush=True)
    report = write_report(results, out)
    bad = [r for r in results if r.outcome in BAD]
    print(f"\n{len(results)} cases: " + ", ".join(f"{c} {sum(r.outcome == c for r in results)}" for c in CLASSES)
          + f"\nreport: {report}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
