"""PALBERT mode (issue 7), recipe level: configs, launch/finetune_glue.py smoke runs, results JSON/table.

The smoke runs use ``--init tiny-random`` with a small loop-mode core on tiny GLUE subsets from
../shared/data/glue; they check that the pipeline completes and reports every exit rule, not accuracy
(the CPU fine-tunes of acceptance 3–4 are reproduced by eval/palbert_sweep.py).
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from adaponder.palbert.config import FinetuneConfigError, load_finetune_config
from adaponder.palbert.finetune import load_glue_tokenizer, results_markdown

REPO = Path(__file__).resolve().parents[1]
CONFIGS = sorted((REPO / "configs" / "glue").glob("*.yaml"))

# A small, cheap core for smoke runs: loop feedback (no 50k-vocab pondering product), one layer, width 64.
SMOKE = ["model.core_mode=loop", "model.random_shape={hidden_size: 64, num_hidden_layers: 1, "
         "num_attention_heads: 4, intermediate_size: 128}", "train.lr=1e-3", "train.lambda_lr=1e-3",
         "train.max_examples=64", "train.epochs=1", "train.eval_every=1", "train.log_every=0",
         "eval.max_examples=48", "eval.sample_draws=2", "timing.max_examples=8", "timing.repeats=1",
         "timing.batch_sizes=[1, 8]", "train.threads=1", "timing.threads=1"]


pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.one_thread


def launcher_main():
    """``main`` of launch/finetune_glue.py (a script, not a package module)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("finetune_glue", REPO / "launch" / "finetune_glue.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


def run_cli(tmp_path, task, extra=(), init="tiny-random"):
    main = launcher_main()
    sets = [a for s in [*SMOKE, *extra] for a in ("--set", s)]
    out = tmp_path / task
    rc = main(["--config", str(REPO / "configs" / "glue" / f"{task}.yaml"), "--init", init,
               "--output", str(out), *sets])
    return rc, out


def test_all_glue_configs_load():
    assert {p.stem for p in CONFIGS} == {"cola", "sst2", "mrpc", "stsb", "rte", "wnli"}
    for path in CONFIGS:
        cfg = load_finetune_config(path)
        assert cfg.task == path.stem and cfg.train.batch_size == 32 and cfg.data.max_length == 128  # B8
        assert cfg.loss.lambda_p == 0.1 and cfg.loss.beta == 0.5 and cfg.eval.q == 0.5  # B6, B7, B9


def test_config_errors_list_every_problem(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("task: sst3\nmodel: {method: act, pasess: 4}\ntrain: {lr: fast, batch_size: 0}\n"
                   "loss: {kl_direction: forward}\nextra: 1\n")
    with pytest.raises(FinetuneConfigError) as err:
        load_finetune_config(bad, ["eval.rules=[q, greedy]"])
    msg = str(err.value)
    for needle in ("task:", "model.method:", "model.pasess: unknown key", "train.lr: must be a number",
                   "train.batch_size: must be >= 1", "loss.kl_direction:", "extra: unknown key", "greedy",
                   str(bad)):
        assert needle in msg, (needle, msg)
    assert len(err.value.problems) == 8


def test_cli_reports_config_errors(tmp_path, capsys):
    main = launcher_main()

    rc = main(["--config", str(REPO / "configs/glue/rte.yaml"), "--init", "tiny-random",
               "--set", "train.lr=-1", "--set", "model.passes=0", "--output", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2 and "train.lr: must be > 0" in err and "model.passes: (N) must be >= 1" in err
    rc = main(["--config", str(REPO / "configs/glue/rte.yaml"), "--init", str(tmp_path / "nowhere")])
    assert rc == 2 and "not a checkpoint directory" in capsys.readouterr().err


def test_tokenizer_and_separator():
    tok = load_glue_tokenizer()
    assert tok.ids("<|endoftext|>") == [tok.eod_id] and tok.ids("") == []
    assert tok.ids("hello") == tok.encode("hello")


def test_finetune_smoke_sst2_writes_every_exit_rule(tmp_path, shared_data):
    rc, out = run_cli(tmp_path, "sst2", ["train.save_model=true"])
    assert rc == 0
    res = json.loads((out / "results.json").read_text())
    rules = res["dev"]["rules"]
    assert set(rules) == {"q", "sample", "expectation", "last", "pabee"}
    n = res["num_passes"]
    for rule, st in rules.items():
        assert 0.0 <= st["metrics"]["accuracy"] <= 1.0
        assert 1.0 <= st["mean_exit_pass"] <= n and st["speedup"] == pytest.approx(n / st["mean_exit_pass"])
        assert sum(st["exit_histogram"]) == pytest.approx(res["data"]["dev_examples"])
    assert rules["last"]["mean_exit_pass"] == rules["expectation"]["mean_exit_pass"] == n
    assert res["online"]["exit_agreement"] == 1.0  # online early exit == offline Q-exit
    assert res["train"]["steps"] == 2 and len(res["train"]["history"]) == 2
    for b in ("batch_1", "batch_8"):
        for rule in rules:
            t = res["timing"][b][rule]
            assert t["sec_per_example"] > 0 and t["ideal_speedup"] == pytest.approx(n / t["mean_exit_pass"])
    table = (out / "results.md").read_text()
    for name in ("Q-exit", "sampling", "expectation", "always-last", "PABEE", "ms/example @1", "ms/example @8",
                 "majority class"):
        assert name in table
    assert table == results_markdown(res)
    assert (out / "model" / "config.json").is_file()


def test_finetune_smoke_rte_pabee_baseline_from_checkpoint(tmp_path, shared_data):
    """A sentence-pair task, the PABEE baseline, and --init from a GPT-NeoX checkpoint directory."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    torch.manual_seed(0)
    ckpt = tmp_path / "neox"
    GPTNeoXForCausalLM(GPTNeoXConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                     intermediate_size=64, vocab_size=50304)).save_pretrained(ckpt)
    rc, out = run_cli(tmp_path, "rte", ["model.method=pabee", "model.passes=3", "data.max_length=64",
                                        "timing.enabled=false"], init=str(ckpt))
    assert rc == 0
    res = json.loads((out / "results.json").read_text())
    assert res["method"] == "pabee" and res["core_mode"] == "loop" and res["select_rule"] == "pabee"
    assert set(res["dev"]["rules"]) == {"pabee", "last"} and res["timing"] is None
    assert res["online"]["exit_agreement"] == 1.0


def test_finetune_smoke_stsb_regression(tmp_path, shared_data):
    rc, out = run_cli(tmp_path, "stsb", ["data.max_length=64", "timing.batch_sizes=[4]"])
    assert rc == 0
    res = json.loads((out / "results.json").read_text())
    assert res["main_metric"] == "combined_score" and res["majority_baseline"] is None
    for st in res["dev"]["rules"].values():
        assert set(st["metrics"]) == {"pearson", "spearmanr", "combined_score"}
    assert res["online"]["exit_agreement"] == 1.0


def test_cli_runs_as_a_script(tmp_path, shared_data):
    """The launcher as users call it (fresh interpreter, argument parsing, exit code)."""
    out = tmp_path / "wnli"
    sets = [a for s in [*SMOKE, "timing.enabled=false", "eval.rules=[q, last]"] for a in ("--set", s)]
    proc = subprocess.run([sys.executable, str(REPO / "launch" / "finetune_glue.py"), "--config",
                           str(REPO / "configs/glue/wnli.yaml"), "--init", "tiny-random", "--output", str(out),
                           *sets], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads((out / "results.json").read_text())
    assert set(res["dev"]["rules"]) == {"q", "last"}
    assert "Q-exit" in proc.stdout


@pytest.mark.slow
@pytest.mark.deepspeed
def test_finetune_under_deepspeed_two_ranks(tmp_path, shared_data):
    """Data parallel through DeepSpeed's engine (ZeRO stage 0, gloo on CPU): two ranks each take half of
    every batch of 32; rank 0 evaluates and writes the results."""
    import socket

    launcher = Path(sys.executable).parent / "deepspeed"
    if not launcher.exists():
        pytest.skip("deepspeed launcher not installed")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "ds"
    sets = [a for s in [*SMOKE, "timing.enabled=false", "eval.rules=[q, last]"] for a in ("--set", s)]
    proc = subprocess.run([str(launcher), "--num_gpus", "2", "--master_port", str(port),
                           str(REPO / "launch" / "finetune_glue.py"), "--deepspeed", "--config",
                           str(REPO / "configs/glue/sst2.yaml"), "--init", "tiny-random", "--output", str(out),
                           *sets], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    res = json.loads((out / "results.json").read_text())
    assert res["train"]["world_size"] == 2 and res["train"]["steps"] == 2
    assert set(res["dev"]["rules"]) == {"q", "last"}
