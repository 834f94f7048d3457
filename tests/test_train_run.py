"""End-to-end training runs in one process (a 1-rank DeepSpeed group on the CPU): resume equals continue,
HF export, non-finite steps, crash during a save, clear errors, continued pretraining (A14), SIGTERM.

Each test runs the real launcher (``launch/pretrain.py``) in a fresh Python process on a toy tokenizer
(~300 tokens) so a step takes milliseconds; see ``tests/helpers_train.py``.
"""

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from helpers_train import REPO, cpu_env, read_metrics, tiny_train_config, write_config


def run_all(launcher, *runs, faults=None):
    """Each run's exit code and all the output; ``faults`` (``tests/faults.py``) are injected into every run."""
    codes, outs = [], []
    for argv in runs:
        code, out = launcher.run(*argv, faults=faults)
        codes.append(code)
        outs.append(out)
    return codes, "\n".join(outs)


def _config(tmp: Path, name: str, data, **sections) -> Path:
    return write_config(tmp / f"{name}.yaml", tiny_train_config(data["data"], data["tokenizer"], tmp / name, **sections))


def _losses(out_dir):
    return [(r["step"], r["loss"], r["lm_loss"], r["ponder_loss"], r["grad_norm"]) for r in read_metrics(out_dir)]


def _tree_digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


# -- resume equals continue + export ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def resumed_runs(data, launcher, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("resume")
    common = dict(train={"steps": 8}, checkpoint={"every": 4, "export_hf": True}, eval={"max_batches": 3})
    a = _config(tmp, "a", data, **common)
    b = _config(tmp, "b", data, **common)
    codes, out = run_all(launcher,
                         ["--config", a],
                         ["--config", b, "--set", "train.stop_at=3"],  # "interrupted" after step 3 ...
                         ["--config", b, "--resume", "auto"])  # ... and continued
    assert codes == [0, 0, 0], out
    return tmp, out


@pytest.mark.integration
def test_resume_equals_continue_bit_for_bit_one_rank(resumed_runs):
    tmp, out = resumed_runs
    straight, resumed = _losses(tmp / "a"), _losses(tmp / "b")
    assert [s for s, *_ in straight] == list(range(1, 9))
    assert resumed == straight  # exact float equality: loss, LM loss, ponder loss, grad norm, all 8 steps
    assert "resumed from" in out and "step00000003" in out
    assert straight[-1][2] < straight[0][2]  # the LM loss falls
    # the ponder loss is on after S0 (step 2 of 8) and k ramps until S1 (step 4)
    recs = read_metrics(tmp / "a")
    assert [r["k"] for r in recs[:2]] == [0.0, 0.0] and recs[-1]["k"] == pytest.approx(0.3)
    assert recs[-1]["ponder_loss"] > 0 and recs[0]["ponder_loss"] == 0
    ev_a, ev_b = read_metrics(tmp / "a", "eval")[-1], read_metrics(tmp / "b", "eval")[-1]
    assert ev_a["val_loss"] == ev_b["val_loss"]


@pytest.mark.integration
def test_exported_checkpoint_loads_with_auto_classes_and_matches_engine_val_loss(resumed_runs, data):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from adaponder.data.loader import iter_eval_batches
    from adaponder.train.report import evaluate_model

    tmp, _ = resumed_runs
    hf = tmp / "a" / "hf"
    model = AutoModelForCausalLM.from_pretrained(hf, trust_remote_code=True)
    # In a process that imported adaponder the registered class serves; elsewhere the code saved with the
    # checkpoint does (tests/test_core_hf.py checks that in a process where adaponder cannot be imported).
    assert type(model).__name__ == "AdaPonderForCausalLM"
    assert (hf / "modeling_adaponder.py").is_file() and "auto_map" in json.loads((hf / "config.json").read_text())
    tok = AutoTokenizer.from_pretrained(hf)
    assert tok.eos_token == "<|endoftext|>" and tok.pad_token == "<|padding|>"
    engine_eval = read_metrics(tmp / "a", "eval")[-1]
    batches = iter_eval_batches(data["data"], 32, 4, max_batches=3)
    mine = evaluate_model(model, batches)
    assert mine["val_tokens"] == engine_eval["val_tokens"]
    assert mine["val_loss"] == pytest.approx(engine_eval["val_loss"], abs=1e-6)
    assert mine["exit_hist"] == engine_eval["exit_hist"]

    # The offline export of the final checkpoint has the same weights.
    proc = subprocess.run([sys.executable, str(REPO / "launch" / "export_hf.py"), str(tmp / "a" / "checkpoints"),
                           str(tmp / "exported")], env=cpu_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    again = AutoModelForCausalLM.from_pretrained(tmp / "exported", trust_remote_code=True)
    for (k, v), (k2, v2) in zip(model.state_dict().items(), again.state_dict().items()):
        assert k == k2 and torch.equal(v, v2), k


@pytest.mark.integration
def test_training_validation_equals_adaponder_perplexity_on_the_same_windows(resumed_runs, data, tmp_path):
    """One definition of validation perplexity: the trainer's final validation and ``adaponder-perplexity
    --packing stream`` on the exported model score the same tokens in the same windows and agree."""
    from adaponder.cli.perplexity import main as perplexity_main

    tmp, _ = resumed_runs
    engine_eval = read_metrics(tmp / "a", "eval")[-1]
    out = tmp_path / "ppl.json"
    code = perplexity_main([str(tmp / "a" / "hf"), "--data", str(data["data"]), "--packing", "stream",
                            "--window", "32", "--max-tokens", str(engine_eval["val_tokens"]), "--json", str(out)])
    assert code == 0
    (row,) = json.loads(out.read_text())["results"].values()
    assert row["tokens"] == engine_eval["val_tokens"]
    assert row["ppl"] == pytest.approx(engine_eval["val_ppl"], rel=1e-5)
    assert row["mean_exit"] == pytest.approx(engine_eval["mean_exit_pass"], abs=1e-9)
    # The default (document) windowing is a different measurement on the same split: it must not agree by accident.
    assert perplexity_main([str(tmp / "a" / "hf"), "--data", str(data["data"]), "--window", "32",
                            "--max-tokens", str(engine_eval["val_tokens"]), "--json", str(out)]) == 0
    (doc_row,) = json.loads(out.read_text())["results"].values()
    assert doc_row["ppl"] != pytest.approx(engine_eval["val_ppl"], rel=1e-5)


@pytest.mark.integration
@pytest.mark.parametrize("stage", [0, 2, 3])
def test_resume_equals_continue_for_every_zero_stage(data, launcher, tmp_path, stage):
    common = dict(train={"steps": 5}, checkpoint={"every": 100}, eval={"at_end": False},
                  deepspeed={"zero_stage": stage})
    a = _config(tmp_path, "a", data, **common)
    b = _config(tmp_path, "b", data, **common)
    codes, out = run_all(launcher, ["--config", a], ["--config", b, "--set", "train.stop_at=2"],
                         ["--config", b, "--resume", "auto"])
    assert codes == [0, 0, 0], out
    straight = _losses(tmp_path / "a")
    assert len(straight) == 5 and _losses(tmp_path / "b") == straight
    assert all(g is not None and 0 < g < float("inf") for *_, g in straight)  # the norm is reported


# -- non-finite steps ---------------------------------------------------------------------------------------
def _module_and_optimizer(tag_dir: Path):
    module = torch.load(tag_dir / "mp_rank_00_model_states.pt", map_location="cpu", weights_only=False)["module"]
    optim = torch.load(next(tag_dir.glob("*optim_states.pt")), map_location="cpu", weights_only=False)
    tensors = {}

    def walk(prefix, x):
        if isinstance(x, torch.Tensor):
            tensors[prefix] = x
        elif isinstance(x, dict):
            for k, v in x.items():
                walk(f"{prefix}.{k}", v)
        elif isinstance(x, (list, tuple)):
            for i, v in enumerate(x):
                walk(f"{prefix}.{i}", v)

    walk("optim", optim["optimizer_state_dict"])
    return module, tensors


@pytest.mark.integration
def test_nonfinite_loss_skips_the_step_and_n_in_a_row_stop_the_run(data, launcher, tmp_path):
    one = _config(tmp_path, "one", data, train={"steps": 5}, checkpoint={"every": 1, "keep": 10})
    many = _config(tmp_path, "many", data, train={"steps": 10, "max_consecutive_skips": 3},
                   checkpoint={"every": 4})
    codes, out = run_all(launcher, ["--config", str(one)], faults={"nonfinite_steps": [3]})
    more, more_out = run_all(launcher, ["--config", str(many)], faults={"nonfinite_steps": [5, 6, 7]})
    codes, out = codes + more, out + "\n" + more_out
    assert codes[0] == 0, out
    # Step 3 was skipped: parameters and optimizer state after it equal those after step 2, bit for bit.
    ck = tmp_path / "one" / "checkpoints"
    m2, o2 = _module_and_optimizer(ck / "step00000002")
    m3, o3 = _module_and_optimizer(ck / "step00000003")
    m4, _ = _module_and_optimizer(ck / "step00000004")
    assert m2.keys() == m3.keys() and all(torch.equal(m2[k], m3[k]) for k in m2)
    assert o2.keys() == o3.keys() and all(torch.equal(o2[k], o3[k]) for k in o2)
    assert any(not torch.equal(m3[k], m4[k]) for k in m3)  # training goes on afterwards
    events = read_metrics(tmp_path / "one", "event")
    assert [e["step"] for e in events if e["event"] == "skipped_step"] == [3]
    assert "step 3: skipped (non-finite loss)" in out

    # Three in a row: a clear message, exit code 3, and the checkpoint of step 4 is the last and intact.
    assert codes[1] == 3
    assert "stopping: 3 consecutive steps (5..7)" in out and "step00000004" in out
    assert (tmp_path / "many" / "checkpoints" / "latest").read_text().strip() == "step00000004"
    codes, out = run_all(launcher, *[["--config", str(many), "--resume", "auto"]])
    assert codes == [0], out  # ... and the run continues from it
    assert read_metrics(tmp_path / "many")[-1]["step"] == 10


def test_a_streak_of_skips_begun_before_a_resume_names_its_first_step(tmp_path):
    """The stop message counts the streak from the resumed state: two skips restored from a checkpoint, then a
    third at step 7, is steps 5..7 (it said "None..7" when the first skip happened before the resume)."""
    from types import SimpleNamespace

    from adaponder.train.stopping import TrainingStopped
    from adaponder.train.trainer import Trainer

    logged = []
    t = Trainer.__new__(Trainer)  # only the state _count_skip reads
    t.cfg = SimpleNamespace(train=SimpleNamespace(max_consecutive_skips=3))
    t.run = SimpleNamespace(sink=SimpleNamespace(log=lambda rec, line=None: logged.append(rec)), ckpt_dir=tmp_path,
                            step=7)
    t.consecutive_skips, t.skipped_total, t._skipped_window = 2, 2, 0
    res = {"loss_scale_skip": False, "skipped": True, "nonfinite_micro": True, "grad_norm": float("nan")}
    with pytest.raises(TrainingStopped) as err:
        t._count_skip(res)
    assert "3 consecutive steps (5..7)" in str(err.value) and err.value.exit_code == 3
    assert [r["event"] for r in logged] == ["skipped_step", "stopped_nonfinite"]


# -- a crash in the middle of a save, and clear errors that touch nothing -----------------------------------
@pytest.mark.integration
def test_crash_during_save_keeps_previous_checkpoint_and_errors_are_clear(data, launcher, tmp_path):
    run = _config(tmp_path, "run", data, train={"steps": 6}, checkpoint={"every": 2})
    codes, out = run_all(launcher, *[["--config", str(run)]], faults={"crash_in_save_at": 4})
    assert codes == [-1] and "SimulatedCrash: simulated crash in the middle of saving step 4" in out  # (escaped main)
    ck = tmp_path / "run" / "checkpoints"
    assert (ck / "latest").read_text().strip() == "step00000002"
    # (temporary names carry the PID of the writing process: the launcher worker's)
    assert (ck / f".tmp-step00000004-{launcher.proc.pid}").is_dir() and not (ck / "step00000004").exists()

    # A fresh start refuses a folder that holds checkpoints.
    fresh = ["--config", str(run)]
    # Bad config, missing data, tokenizer mismatch, corrupt / incompatible checkpoints: exit 2, files untouched.
    missing = ["--config", str(run), "--set", f"data.path={tmp_path / 'nowhere'}", "--set",
               f"train.out_dir={tmp_path / 'md'}"]
    mismatch = ["--config", str(run), "--set", "data.tokenizer=null", "--set", f"train.out_dir={tmp_path / 'mm'}"]
    incompatible = ["--config", str(run), "--resume", "auto", "--set", "model.hidden_size=64"]
    bad_value = ["--config", str(run), "--set", "optim.lr=-1", "--set", "optim.nope=1"]
    before = _tree_digest(ck / "step00000002")
    codes, out = run_all(launcher, *[fresh, missing, mismatch, incompatible, bad_value])
    assert codes == [2, 2, 2, 2, 2], out
    assert "already holds checkpoints" in out and "--resume auto" in out
    assert f"{tmp_path / 'nowhere'} does not exist" in out
    assert "fingerprint" in out and "re-run adaponder-prepare" in out
    assert "model.hidden_size is 32 in the checkpoint but 64 in this run" in out
    assert "optim.lr: must be > 0" in out and "optim.nope: unknown key" in out
    assert _tree_digest(ck / "step00000002") == before

    # Corrupt: a truncated optimizer file, then garbage of the right size in a rank file.
    optim_file = next((ck / "step00000002").glob("*optim_states.pt"))
    good = optim_file.read_bytes()
    optim_file.write_bytes(good[: len(good) // 2])
    resume = ["--config", str(run), "--resume", "auto"]
    codes, out = run_all(launcher, *[resume])
    assert codes == [2] and "truncated or corrupt" in out and optim_file.name in out
    optim_file.write_bytes(good)
    rank_file = ck / "step00000002" / "rank00000.pt"
    good_rank = rank_file.read_bytes()
    rank_file.write_bytes(os.urandom(len(good_rank)))
    codes, out = run_all(launcher, *[resume])
    assert codes == [2] and "rank00000.pt has sha256" in out and "(corrupt)" in out  # the content hash tells
    rank_file.write_bytes(good_rank)

    # Intact again: resuming continues from step 2 and cleans the half-written folder up.
    codes, out = run_all(launcher, *[resume])
    assert codes == [0], out
    assert "resumed from" in out and "step00000002" in out
    assert (ck / "latest").read_text().strip() == "step00000006" and not list(ck.glob(".tmp-step00000004*"))


@pytest.mark.integration
def test_rewind_to_an_older_checkpoint_replaces_the_abandoned_branch(data, launcher, tmp_path):
    run = _config(tmp_path, "run", data, train={"steps": 6}, checkpoint={"every": 2, "keep": 5},
                  eval={"at_end": False})
    codes, out = run_all(launcher, ["--config", run])
    assert codes == [0], out
    ck = tmp_path / "run" / "checkpoints"
    first = _losses(tmp_path / "run")
    old4 = (ck / "step00000004" / "trainer_state.json").read_text()
    codes, out = run_all(launcher, ["--config", run, "--resume", ck / "step00000002"])
    assert codes == [0], out
    assert (ck / "step00000004" / "trainer_state.json").read_text() != old4  # rewritten by the new branch
    assert (ck / "latest").read_text().strip() == "step00000006"
    assert sorted(p.name for p in ck.iterdir() if p.name.startswith((".tmp", ".old"))) == []
    assert _losses(tmp_path / "run") == first  # deterministic: the same steps again


# -- continued pretraining (A14) ----------------------------------------------------------------------------
@pytest.mark.integration
def test_continued_pretraining_gates_only_then_joint(data, launcher, tmp_path):
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    torch.manual_seed(0)
    neox = GPTNeoXForCausalLM(GPTNeoXConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                            intermediate_size=64, vocab_size=320, max_position_embeddings=64,
                                            rotary_pct=0.25, use_parallel_residual=True, tie_word_embeddings=False))
    neox.save_pretrained(tmp_path / "neox")
    source = {k: v.clone() for k, v in neox.state_dict().items()}
    cfg = tiny_train_config(data["data"], data["tokenizer"], tmp_path / "cpt",
                            init={"backbone": str(tmp_path / "neox"), "gates_only_tokens": 3 * 256},
                            train={"steps": 6}, schedule={"s0": 0, "s1": 2}, checkpoint={"every": 1, "keep": 10})
    cfg["model"] = {"mode": "adaponder", "passes": 4, "gate_init_bias": 2.0}
    codes, out = run_all(launcher, *[["--config", str(write_config(tmp_path / "cpt.yaml", cfg))]])
    assert codes == [0], out
    assert [r["stage"] for r in read_metrics(tmp_path / "cpt")] == ["gates_only"] * 3 + ["joint"] * 3
    ck = tmp_path / "cpt" / "checkpoints"
    states = {s: torch.load(ck / f"step{s:08d}" / "mp_rank_00_model_states.pt", map_location="cpu",
                            weights_only=False)["module"] for s in (1, 3, 6)}
    backbone = [k for k in source if k in states[3] and source[k].is_floating_point()]
    assert len(backbone) > 10
    for k in backbone:  # the gates-only stage leaves the backbone bit-identical
        assert torch.equal(states[1][k], source[k]) and torch.equal(states[3][k], source[k]), k
    gates = [k for k in states[3] if k.startswith("gates.")]
    assert gates and any(not torch.equal(states[1][k], states[3][k]) for k in gates)  # the gates learn
    assert any(not torch.equal(states[6][k], source[k]) for k in backbone)  # then everything trains


# -- SIGTERM ------------------------------------------------------------------------------------------------
@pytest.mark.integration
def test_sigterm_writes_a_checkpoint_that_resume_auto_continues(data, launcher, tmp_path):
    cfg = _config(tmp_path, "sig", data, train={"steps": 100000}, checkpoint={"every": 100000},
                  eval={"at_end": False})
    proc = subprocess.Popen([sys.executable, str(REPO / "launch" / "pretrain.py"), "--config", str(cfg)],
                            env=cpu_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    metrics = tmp_path / "sig" / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if metrics.is_file() and len(metrics.read_text().splitlines()) >= 3:
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, out
    assert "received SIGTERM" in out
    ck = tmp_path / "sig" / "checkpoints"
    tag = (ck / "latest").read_text().strip()
    step = int(tag.removeprefix("step"))
    assert step >= 3 and (ck / tag / "trainer_state.json").is_file()
    assert read_metrics(tmp_path / "sig")[-1]["step"] == step
    codes, out = run_all(launcher, *[["--config", str(cfg), "--resume", "auto",
                                                "--set", f"train.stop_at={step + 2}"]])
    assert codes == [0], out
    assert f"resumed from {ck / tag} at step {step}" in out
    assert [r["step"] for r in read_metrics(tmp_path / "sig")][-3:] == [step, step + 1, step + 2]
