"""Nothing silent at the edges: each kind of case that used to be accepted silently, or refused with a traceback
or an unclear message, now ends in one ``error:`` line (exit 2) or one ``warning:`` line, and a refusal changes
nothing on disk. Each test is one row of docs/reliability.md, section Q."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import REPO
from helpers_train import cpu_env, tiny_train_config, write_config


def _run(*args, cwd=None, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *map(str, args)], env=cpu_env(PYTHONPATH=str(REPO)), cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)


def _lines(text: str, prefix: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith(prefix)]


def _one_error(p: subprocess.CompletedProcess, *must: str) -> str:
    """Exit 2, no traceback, exactly one ``error:`` line naming ``must`` (a configuration error lists its
    problems under it as ``  - …`` lines); returns the line with its problems."""
    assert p.returncode == 2, p.stderr[-3000:]
    assert "Traceback" not in p.stderr, p.stderr[-3000:]
    errors = _lines(p.stderr, "error: ")
    assert len(errors) == 1, p.stderr[-3000:]
    text = " ".join([errors[0]] + [ln.strip() for ln in p.stderr.splitlines() if ln.startswith("  - ")])
    for m in must:
        assert m in text, text
    return text


def _snapshot(*roots: Path) -> dict[str, tuple[int, str]]:
    """Every file under ``roots`` with its size and SHA-256 (what "nothing changed on disk" compares)."""
    out = {}
    for root in roots:
        if root.is_file():
            out[str(root)] = (root.stat().st_size, hashlib.sha256(root.read_bytes()).hexdigest())
            continue
        for p in sorted(root.rglob("*")) if root.exists() else []:
            if p.is_file():
                out[str(p)] = (p.stat().st_size, hashlib.sha256(p.read_bytes()).hexdigest())
    return out


def _pretrain(cfg: Path, *extra: str) -> subprocess.CompletedProcess:
    return _run("-m", "adaponder.cli.pretrain", "--config", cfg, *extra)


# -- silent acceptance: studies, data, schedules, labels ----------------------------------------------------
@pytest.mark.integration
def test_a_second_study_on_a_study_folder_in_use_exits_2_naming_the_holder(tmp_path):
    from adaponder.run_lock import lock_folder

    runs, results, report = tmp_path / "runs", tmp_path / "results", tmp_path / "study.md"
    held = lock_folder(runs, "study folder")  # the first study, at work
    try:
        before = _snapshot(tmp_path)
        p = _run(REPO / "launch" / "study.py", "--config", REPO / "configs/study/cpu.yaml", "--profile", "quick",
                 "--set", f"study.runs_dir={runs}", "--set", f"study.results_dir={results}",
                 "--set", f"study.report={report}", "--report-only", cwd=tmp_path)
        _one_error(p, f"study folder {runs} is in use by another job", f"PID {os.getpid()}", "wait for it to finish")
        assert _snapshot(tmp_path) == before and not results.exists() and not report.exists()
    finally:
        held.release()


@pytest.mark.integration
def test_prepare_overwrite_refuses_a_data_folder_a_run_reads(tmp_path, data):
    from adaponder.data.in_use import hold_data

    out = tmp_path / "prepared"
    shutil.copytree(data["data"], out)
    reader = hold_data(out, f"run folder {tmp_path / 'run'}")  # registered as a training run registers
    try:
        before = _snapshot(tmp_path)
        p = _run("-m", "adaponder.cli.prepare", data["corpus"], "-o", out, "--tokenizer", data["tokenizer"],
                 "-j", "1", "--no-progress", "--overwrite")
        _one_error(p, f"output folder {out} is in use", f"run folder {tmp_path / 'run'}", f"PID {os.getpid()}")
        assert _snapshot(tmp_path) == before
        assert not [x for x in tmp_path.iterdir() if x.name.startswith(".prepared.")], list(tmp_path.iterdir())
    finally:
        reader.release()
    assert not (out / ".adaponder.readers").exists()  # released: no trace left in the data folder


@pytest.mark.integration
def test_a_run_registers_as_a_reader_and_refuses_a_shard_edited_after_preparation(tmp_path, data):
    from adaponder.data.in_use import hold_data, live_readers

    copy = tmp_path / "prepared"
    shutil.copytree(data["data"], copy)
    shard = copy / "train-00000.bin"
    raw = bytearray(shard.read_bytes())
    raw[100:102], raw[102:104] = raw[102:104], raw[100:102]  # two tokens swapped: same size, same ids
    assert bytes(raw) != shard.read_bytes()
    shard.write_bytes(bytes(raw))
    cfg = write_config(tmp_path / "run.yaml", tiny_train_config(copy, data["tokenizer"], tmp_path / "run"))
    before = _snapshot(tmp_path)
    _one_error(_pretrain(cfg), f"shard {shard} changed after preparation", "sha256", "meta.json")
    assert _snapshot(tmp_path) == before and not (tmp_path / "run").exists()
    # (the reader registration itself: a live holder is seen, a released one is gone)
    reader = hold_data(copy, "run folder R")
    assert live_readers(copy) and live_readers(copy)[0].startswith("run folder R (host ")
    reader.release()
    assert live_readers(copy) == []


@pytest.mark.parametrize("sets, must", [
    (["optim.warmup=20"], ["optim.warmup: 20 warm-up steps exceed the run's 8 steps"]),
    (["schedule.s0=9", "schedule.s1=10"], ["schedule.s0: the ponder loss starts at step 9", "never be applied"]),
    (["schedule.s0=8", "schedule.s1=8", "schedule.ponder_weight=0", "schedule.gate_warmup=bypassed"],
     ["schedule.gate_warmup: 'bypassed' lasts until schedule.s0 (step 8)"]),
    (["train.stop_at=12"], ["train.stop_at: step 12 is beyond the run's 8 steps"]),
], ids=["lr-warmup", "ponder-start", "gate-warmup", "stop-at"])
@pytest.mark.integration
def test_a_schedule_the_run_cannot_carry_out_is_one_error_and_nothing_is_written(tmp_path, data, sets, must):
    cfg = write_config(tmp_path / "run.yaml", tiny_train_config(data["data"], data["tokenizer"], tmp_path / "run"))
    before = _snapshot(tmp_path)
    _one_error(_pretrain(cfg, *[a for s in sets for a in ("--set", s)]), *must)
    assert _snapshot(tmp_path) == before and not (tmp_path / "run").exists()


@pytest.mark.integration
def test_odd_schedules_and_a_split_smaller_than_a_batch_warn_with_their_sizes(tmp_path, data):
    raw = tiny_train_config(data["data"], data["tokenizer"], tmp_path / "run", schedule={"s0": 1, "s1": 5},
                            train={"steps": 2, "micro_batch": 64, "grad_accum": 64}, eval={"at_end": False})
    raw["data"]["seq_len"] = 63
    cfg = write_config(tmp_path / "run.yaml", raw)
    p = _pretrain(cfg)
    assert p.returncode == 0, p.stderr[-3000:]
    warnings = _lines(p.stderr, "warning: ")
    assert any(w.startswith("warning: schedule.s1: the ponder-loss ramp (k up to schedule.k_max) ends at step 5, "
                            "after the run's last step (1; 2 steps)") for w in warnings), warnings
    small = [w for w in warnings if w.startswith("warning: data.path:")]
    assert len(small) == 1 and "samples of data.seq_len + 1 = 64 tokens, fewer than one global batch of 4096" in \
        small[0] and "train.micro_batch 64 × grad_accum 64 × 1 ranks" in small[0], warnings


def _labelled(tmp: Path, seed: int) -> Path:
    from adaponder.data.reasoning import MultiHopSpec, write_multihop

    folder = tmp / f"corpus{seed}"
    write_multihop(folder, MultiHopSpec(symbols=24, max_hops=3, filler_symbols=5, queries=6, doc_tokens=32,
                                        train_docs=16, val_docs=6, seed=seed))
    return folder


def _checkpoint_for(folder: Path, out: Path) -> Path:
    """A random model saved with ``folder``'s tokenizer (what a run on that corpus exports)."""
    from helpers_evaluation import tiny_model

    from adaponder.train.export import save_tokenizer

    tiny_model().save_pretrained(out)
    save_tokenizer(out, str(folder / "tokenizer.json"))
    return out


@pytest.mark.integration
def test_difficulty_refuses_labels_of_another_corpus_and_a_foreign_tokenizer(tmp_path):
    a, b = _labelled(tmp_path, 1), _labelled(tmp_path, 2)
    ckpt = _checkpoint_for(a, tmp_path / "ckpt")
    ok = _run("-m", "adaponder.cli.difficulty", ckpt, "--data", a, "--batch-size", "8")
    assert ok.returncode == 0, ok.stderr[-3000:]  # its own labels: scored
    shutil.copy(b / "val.labels.npy", a / "val.labels.npy")  # another corpus's labels, of the same length
    before = _snapshot(tmp_path)
    _one_error(_run("-m", "adaponder.cli.difficulty", ckpt, "--data", a, "--json", tmp_path / "r.json"),
               f"{a / 'val.labels.npy'}: these labels do not belong to the corpus's val split")
    assert _snapshot(tmp_path) == before and not (tmp_path / "r.json").exists()
    # a model whose tokenizer is not the corpus's
    from helpers_evaluation import tiny_tokenizer

    other = _checkpoint_for(b, tmp_path / "other")
    tiny_tokenizer().save_pretrained(other)
    _one_error(_run("-m", "adaponder.cli.difficulty", other, "--data", b), "the model's tokenizer",
               "is not the corpus's")


def test_a_corpus_written_before_labels_were_fingerprinted_is_still_evaluated(tmp_path):
    import json

    from adaponder.data.fingerprint import check_labelled_corpus

    a = _labelled(tmp_path, 1)
    meta = json.loads((a / "meta.json").read_text())
    for split in meta["splits"].values():
        del split["labels_fingerprint"]
    (a / "meta.json").write_text(json.dumps(meta))
    check_labelled_corpus(a, "val")  # no fingerprint to compare: accepted (shards and tokenizer still checked)


# -- the commands' own arguments ------------------------------------------------------------------------------
@pytest.mark.integration
def test_an_unknown_key_in_deepspeed_overrides_is_one_error_naming_it(tmp_path, data):
    cfg = write_config(tmp_path / "run.yaml", tiny_train_config(
        data["data"], data["tokenizer"], tmp_path / "run",
        deepspeed={"zero_stage": 1, "precision": "fp32", "overrides": {"zero_optimization": {"bogus_key": 1}}}))
    before = _snapshot(tmp_path)
    _one_error(_pretrain(cfg), "deepspeed.overrides.zero_optimization.bogus_key: unknown DeepSpeed key")
    assert _snapshot(tmp_path) == before and not (tmp_path / "run").exists()


@pytest.mark.integration
def test_a_list_that_does_not_parse_and_a_path_through_a_file_are_named(tmp_path, data):
    cfg = write_config(tmp_path / "run.yaml", tiny_train_config(data["data"], data["tokenizer"], tmp_path / "run"))
    before = _snapshot(tmp_path)
    _one_error(_pretrain(cfg, "--set", "optim.betas=[0.9,0.95"),
               "optim.betas: '[0.9,0.95' does not parse as a list", "expected YAML flow syntax")
    (tmp_path / "afile").write_text("x")
    before = _snapshot(tmp_path)
    _one_error(_pretrain(cfg, "--set", f"train.out_dir={tmp_path / 'afile' / 'run'}"),
               f"Not a directory: a part of {tmp_path / 'afile' / 'run'} is a file, not a folder")
    _one_error(_pretrain(cfg, "--set", f"train.out_dir={tmp_path / 'afile'}"),
               f"File exists: a file, not a folder, is in the way at {tmp_path / 'afile'}")
    assert _snapshot(tmp_path) == before


@pytest.mark.integration
@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a read-only tmpfs needs root")
def test_a_read_only_output_names_the_path_and_the_cause(tmp_path, data):
    ro = tmp_path / "ro"
    ro.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(ro)]).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        cfg = write_config(tmp_path / "run.yaml", tiny_train_config(data["data"], data["tokenizer"], ro / "run"))
        _one_error(_pretrain(cfg), f"Read-only file system: {ro / 'run'} lies on a file system mounted read-only")
    finally:
        subprocess.run(["umount", str(ro)])


def _hf(tmp: Path) -> Path:
    from helpers_evaluation import tiny_model, tiny_tokenizer

    out = tmp / "hf"
    tiny_model().save_pretrained(out)
    tiny_tokenizer().save_pretrained(out)
    return out


@pytest.mark.integration
def test_a_truncated_safetensors_and_a_bad_tau_list_are_named_before_anything_loads(tmp_path):
    hf = _hf(tmp_path)
    text = tmp_path / "t.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 20)
    _one_error(_run("-m", "adaponder.cli.dial", hf, "--data", text, "--taus", "0.5,x"),
               "--taus '0.5,x': 'x' is not a number; expected comma-separated numbers in (0, 1)")
    _one_error(_run("-m", "adaponder.cli.dial", hf, "--data", text, "--taus", "0.5,1.5"), "τ 1.5 is out of range")
    weights = hf / "model.safetensors"
    os.truncate(weights, weights.stat().st_size // 2)
    before = _snapshot(tmp_path)
    _one_error(_run("-m", "adaponder.cli.perplexity", hf, "--data", text, "--json", tmp_path / "r.json"),
               f"{weights}: cannot be read", "truncated or damaged")
    assert _snapshot(tmp_path) == before


@pytest.mark.parametrize("script, args, must", [
    ("bench_speculative.py", ["--shapes", "tiny:adaponder", "--gammas", "2,0"], "--gammas '2,0': γ 0 is out of range"),
    ("bench_speculative.py", ["--shapes", "tiny:adaponder", "--batches", "0"], "--batches '0': batch size 0 is out"),
    ("bench_inference.py", ["--size", "tiny", "--batches", "1,x"], "--batches '1,x': 'x' is not an integer"),
    ("bench_inference.py", ["--size", "tiny", "--batch", "0"], "--batch '0': batch size 0 is out of range"),
], ids=["gamma-0", "spec-batch-0", "batch-not-int", "batch-0"])
@pytest.mark.integration
def test_benchmark_lists_are_checked_before_any_model_is_built(tmp_path, script, args, must):
    before = _snapshot(tmp_path)
    _one_error(_run(REPO / "eval" / script, *args, "--json", tmp_path / "rows.json", timeout=120), must,
               "expected comma-separated integers >= 1")
    assert _snapshot(tmp_path) == before


def test_integer_only_model_args_are_named(tmp_path):
    from adaponder.errors import UsageError
    from adaponder.evaluation.lm_eval_model import _as_int

    assert _as_int("4", "speculative_draft_tokens") == 4 and _as_int(None) is None and _as_int(3.0) == 3
    for bad in ("2.5", 2.5, "four"):
        with pytest.raises(UsageError, match=r"--model_args speculative_draft_tokens=.*: not an integer; expected a "
                                             "whole number"):
            _as_int(bad, "speculative_draft_tokens")


@pytest.mark.integration
def test_an_unknown_lm_eval_task_is_one_line_with_the_closest_names(tmp_path):
    hf = _hf(tmp_path)
    p = _run("-m", "adaponder.cli.lm_eval", hf, "--tasks", "adaponder_piqaa", "--limit", "1", "--device", "cpu")
    _one_error(p, "--tasks adaponder_piqaa: no such lm-eval task, group or tag; did you mean adaponder_piqa")


@pytest.mark.integration
def test_finetune_glue_takes_a_preset_name():
    from adaponder.resources import find_config

    assert find_config("rte", "glue") == REPO / "configs" / "glue" / "rte.yaml"
    assert find_config("configs/glue/rte.yaml", "glue").resolve() == (REPO / "configs/glue/rte.yaml").resolve()
    assert find_config("tiny") == REPO / "configs" / "tiny.yaml"  # the pretraining presets as before
    p = _run("-m", "adaponder.cli.finetune_glue", "--config", "rte", "--init", "NOPE-missing", "--output", "/nonexistent/x")
    assert p.returncode == 2 and "config file rte does not exist" not in p.stderr, p.stderr[-2000:]


def test_labels_of_the_wrong_length_in_forward_name_both_shapes():
    from adaponder.modeling import AdaPonderConfig, AdaPonderForCausalLM
    from adaponder.modeling.input_checks import ModelInputError

    model = AdaPonderForCausalLM(AdaPonderConfig(vocab_size=97, hidden_size=32, num_hidden_layers=2,
                                                 num_attention_heads=4, intermediate_size=64,
                                                 max_position_embeddings=32, mode="adaponder")).eval()
    ids = torch.zeros(2, 8, dtype=torch.long)
    with pytest.raises(ModelInputError, match=r"labels must have the shape of input_ids \(2, 8\) .*got \(2, 7\)"):
        model(ids, labels=ids[:, :7])
    with pytest.raises(ModelInputError, match=r"got \(1, 8\)"):
        model(ids, labels=ids[:1])


def _build_folder_lock(root: Path) -> Path:
    from adaponder.train.extensions import lock_path

    lock = lock_path("deepspeed_shm_comm", root)
    lock.parent.mkdir(parents=True)
    lock.touch()
    old = time.time() - 3600  # a build that stopped an hour ago: no file of it changed since
    for path in (lock, lock.parent):
        os.utime(path, (old, old))
    return lock


def test_a_lifeless_build_lock_in_a_shared_folder_is_named_and_given_up_on(tmp_path):
    from adaponder.train.extensions import ExtensionLockError, wait_for_live_builds

    said = []
    wait_for_live_builds(tmp_path, timeout=0.3, poll=0.05, say=said.append)  # no lock: no wait, nothing said
    assert said == []
    lock = _build_folder_lock(tmp_path)
    with pytest.raises(ExtensionLockError, match=rf"{lock}.*no sign of a build.*rm {lock}"):
        wait_for_live_builds(tmp_path, timeout=0.3, poll=0.05, say=said.append)
    assert len(said) == 1 and str(lock) in said[0] and "giving up after 0.3 s" in said[0]
    assert lock.exists()  # a folder shared with other programs: their lock is never deleted for them


@pytest.mark.integration
def test_a_live_build_is_waited_for_and_never_called_dead(tmp_path):
    # a compiler working in the build folder: the wait outlasts the lifeless bound and gives no advice to delete
    import threading

    from adaponder.train.extensions import wait_for_live_builds

    lock = _build_folder_lock(tmp_path)
    compiler = subprocess.Popen(["sleep", "600"], cwd=lock.parent)
    try:
        threading.Timer(1.0, lock.unlink).start()  # the build finishing, after 5x the lifeless bound
        said = []
        wait_for_live_builds(tmp_path, timeout=0.2, poll=0.05, say=said.append)
    finally:
        compiler.kill()
        compiler.wait()
    assert not lock.exists() and len(said) == 1, said
    assert f"process {compiler.pid} is working in it" in said[0] and "rm " not in said[0]


def test_files_changing_count_as_a_live_build(tmp_path):
    from adaponder.train.extensions import shows_life

    folder = _build_folder_lock(tmp_path).parent
    assert shows_life(folder) is None
    (folder / "shm.o").write_bytes(b"")  # an object file just written
    assert "changed" in shows_life(folder)


def test_a_killed_builds_lock_in_the_projects_own_folder_is_cleared(tmp_path, monkeypatch):
    # the owner lock is held: no live build can be behind a torch lock in this environment's own folder
    from adaponder.train.extensions import extensions_ready

    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    monkeypatch.delenv("ADAPONDER_TORCH_EXTENSIONS_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    said = []
    with extensions_ready(say=said.append) as root:
        assert root.is_relative_to(tmp_path / "adaponder" / "torch_extensions") and said == []
        assert os.environ["TORCH_EXTENSIONS_DIR"] == str(root)
    lock = _build_folder_lock(root)
    with extensions_ready(say=said.append):
        assert not lock.exists()
    assert len(said) == 1 and said[0].startswith(f"removed {lock}, left by a build of deepspeed_shm_comm that was")


def test_environments_get_folders_of_their_own_and_a_users_folder_stands(tmp_path, monkeypatch):
    from adaponder.train import extensions

    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    monkeypatch.delenv("ADAPONDER_TORCH_EXTENSIONS_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    mine, _ = extensions.use_environment_extensions_dir()
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "other-venv"))
    # a folder this project chose in another environment (a parent process's) is not taken for the user's
    theirs, ours = extensions.use_environment_extensions_dir()
    assert ours and theirs != mine and theirs == extensions.environment_extensions_dir()
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "shared"))
    assert extensions.use_environment_extensions_dir() == (tmp_path / "shared", False)


@pytest.mark.integration
def test_the_owner_lock_names_its_holder_and_goes_with_it(tmp_path):
    # a holder killed by SIGKILL leaves the lock file, not the lock: the next start takes it at once
    from adaponder.train.extensions import OWNER_LOCK, owner_lock

    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; sys.path.insert(0, sys.argv[1]); from pathlib import Path\n"
        "from adaponder.train.extensions import owner_lock\n"
        "with owner_lock(Path(sys.argv[2])):\n print('held', flush=True); time.sleep(600)"), str(REPO), str(tmp_path)],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        import threading

        threading.Timer(0.5, holder.kill).start()
        said = []
        with owner_lock(tmp_path, say=said.append):
            assert (tmp_path / OWNER_LOCK).read_text() == f"PID {os.getpid()}"
    finally:
        holder.kill()
        holder.wait()
    assert len(said) == 1 and f"waiting for PID {holder.pid} to finish" in said[0], said


@pytest.mark.parametrize("value", ["soon", "-3", "0", "nan"])
def test_a_bad_build_lock_timeout_is_named(value, tmp_path, monkeypatch):
    # named at a run's start whichever folder it uses, before any build or wait
    from adaponder.errors import UsageError
    from adaponder.train.extensions import extensions_ready

    monkeypatch.setenv("ADAPONDER_BUILD_LOCK_TIMEOUT", value)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    for shared in (None, str(tmp_path / "shared")):
        if shared:
            monkeypatch.setenv("TORCH_EXTENSIONS_DIR", shared)
        else:
            monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
            monkeypatch.delenv("ADAPONDER_TORCH_EXTENSIONS_DIR", raising=False)
        with pytest.raises(UsageError, match=rf"ADAPONDER_BUILD_LOCK_TIMEOUT='{value}': expected a positive number"):
            with extensions_ready():
                pass
    assert not (tmp_path / "adaponder").exists() and not (tmp_path / "shared").exists()  # nothing made


@pytest.mark.integration
def test_a_run_with_a_lifeless_build_lock_in_a_shared_folder_stops_with_one_error_line(tmp_path, data):
    # a build killed midway in a folder the user shares (TORCH_EXTENSIONS_DIR): the run says so and stops
    extensions = tmp_path / "extensions"
    lock = _build_folder_lock(extensions)
    cfg = write_config(tmp_path / "run.yaml", tiny_train_config(data["data"], data["tokenizer"], tmp_path / "run"))
    p = subprocess.run([sys.executable, "-m", "adaponder.cli.pretrain", "--config", str(cfg)],
                       env=cpu_env(PYTHONPATH=str(REPO), ADAPONDER_BUILD_LOCK_TIMEOUT="3",
                                   TORCH_EXTENSIONS_DIR=str(extensions)),
                       capture_output=True, text=True, timeout=600)
    assert p.returncode != 0 and "Traceback" not in p.stderr, p.stderr[-3000:]
    errors = _lines(p.stderr, "error: ")
    assert len(errors) == 1 and str(lock) in errors[0] and "rm " in errors[0], p.stderr[-3000:]
    assert f"waiting for {lock}" in p.stderr
    assert lock.exists()  # another process's lock is never deleted for it
    assert not (tmp_path / "run" / "checkpoints").exists()
