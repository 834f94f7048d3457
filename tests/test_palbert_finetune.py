"""PALBERT mode, recipe level: configs, launch/finetune_glue.py smoke runs, results JSON/table.

The smoke runs use ``--init tiny-random`` with a small loop-mode core on tiny GLUE subsets from
../shared/data/glue; they check that the pipeline completes and reports every exit rule, not accuracy
(the CPU fine-tunes of acceptance 3–4 are reproduced by eval/palbert_sweep.py). They run in a worker
process (fine-tuning joins a process group; see tests/helpers_finetune.py). Checkpoints, resume,
signals and ZeRO-3 are in tests/test_finetune_resume.py.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from adaponder.palbert.config import FinetuneConfigError, load_finetune_config
from adaponder.palbert.finetune import load_glue_tokenizer
from adaponder.palbert.results import results_markdown
from helpers_finetune import SMOKE, FinetuneWorker, deepspeed_finetune, finetune_argv, free_port, sets
from helpers_train import cpu_env

REPO = Path(__file__).resolve().parents[1]
# the task presets; base.yaml is the recipe they extend
CONFIGS = sorted(p for p in (REPO / "configs" / "glue").glob("*.yaml") if p.stem != "base")

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.one_thread


@pytest.fixture(scope="module")
def worker():
    w = FinetuneWorker()
    yield w
    w.close()


def run_cli(worker, tmp_path, task, extra=(), init="tiny-random"):
    out = tmp_path / task
    rc, log = worker.run(finetune_argv(task, out, *extra, init=init))
    assert rc == 0, log[-3000:]
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
                   "train.batch_size: must be >= 1", "loss.kl_direction:", "extra: unknown section", "greedy",
                   str(bad)):
        assert needle in msg, (needle, msg)
    assert len(err.value.problems) == 8


def test_deepspeed_section_is_typed_and_names_bad_keys():
    """The pretraining config's DeepSpeedConfig with fine-tuning defaults; unknown keys and bad values named."""
    rte = REPO / "configs/glue/rte.yaml"
    ds = load_finetune_config(rte).deepspeed
    assert (ds.zero_stage, ds.precision, ds.offload_optimizer, ds.overrides) == (0, "fp32", "none", {})
    overrides = "deepspeed.overrides={zero_optimization: {stage3_max_live_parameters: 1000}}"
    ds = load_finetune_config(rte, ["deepspeed.zero_stage=3", "deepspeed.precision=bf16", overrides]).deepspeed
    assert ds.zero_stage == 3 and ds.precision == "bf16" and ds.overrides["zero_optimization"]
    with pytest.raises(FinetuneConfigError) as err:
        load_finetune_config(rte, ["deepspeed.zero_stage=4", "deepspeed.stage=3", "deepspeed.precision=fp8",
                                   "deepspeed.offload_param=cpu", "deepspeed.zero_optimization={stage: 3}",
                                   "checkpoint.keep=0"])
    msg = str(err.value)
    for needle in ("deepspeed.stage: unknown key (known: zero_stage, precision,",
                   "deepspeed.zero_optimization: unknown key", "raw DeepSpeed settings go under deepspeed.overrides",
                   "deepspeed.zero_stage: must be <= 3, got 4", "deepspeed.precision: must be 'fp32' | 'bf16' | 'fp16'",
                   "checkpoint.keep: must be >= 1"):
        assert needle in msg, (needle, msg)
    # offload_param is checked against zero_stage only when zero_stage itself is valid
    assert not any(p.startswith("deepspeed.offload_param") for p in err.value.problems)
    with pytest.raises(FinetuneConfigError) as err:
        load_finetune_config(rte, ["deepspeed.offload_param=cpu", "deepspeed.offload_optimizer=nvme"])
    assert err.value.problems == ["deepspeed.offload_optimizer: needs zero_stage >= 1",
                                  "deepspeed.offload_param: needs zero_stage 3",
                                  "deepspeed.nvme_path: required for nvme offload"]


def test_config_reports_every_bad_key_at_once_with_its_path():
    """Each key's limits live in its annotation: one error lists every broken limit, in file order, by key path."""
    rte = REPO / "configs/glue/rte.yaml"
    with pytest.raises(FinetuneConfigError) as err:
        load_finetune_config(rte, ["model.passes=0", "model.classifier_dropout=1", "loss.lambda_p=1",
                                   "data.max_length=3", "train.lr=0", "train.stop_at=0", "eval.q=1.5",
                                   "timing.batch_sizes=[1, 0]", "checkpoint.every=-1",
                                   "model.attn_implementation=fast"])
    assert err.value.problems == [
        "model.passes: must be >= 1, got 0",
        "model.classifier_dropout: must be < 1, got 1",
        "model.attn_implementation: must be 'sdpa' | 'eager' | 'flash_attention_2', got 'fast'",
        "loss.lambda_p: must be < 1, got 1",
        "data.max_length: must be >= 4, got 3",
        "train.lr: must be > 0, got 0",
        "train.stop_at: must be >= 1, got 0",
        "eval.q: must be <= 1, got 1.5",
        "timing.batch_sizes: must be >= 1, got 0",
        "checkpoint.every: must be >= 0, got -1",
    ]
    with pytest.raises(FinetuneConfigError) as err:
        load_finetune_config(rte, ["timing.batch_sizes=[]", "train.early_stopping_patience=true"])
    assert err.value.problems == ["train.early_stopping_patience: must be an integer, got True",
                                  "timing.batch_sizes: must hold at least 1 item(s), got []"]


def test_config_reads_yaml_number_strings(tmp_path):
    """YAML 1.1 reads 1e-5 and 1e3 as strings; number keys accept them (integral floats for integer keys)."""
    cfg_file = tmp_path / "rte.yaml"
    cfg_file.write_text("task: rte\ntrain: {lr: 1e-5, lambda_lr: 1e-4, max_steps: 1e3, epochs: 2}\n")
    t = load_finetune_config(cfg_file).train
    assert (t.lr, t.lambda_lr, t.max_steps, t.epochs) == (1e-5, 1e-4, 1000, 2.0)
    assert type(t.max_steps) is int and type(t.epochs) is float
    with pytest.raises(FinetuneConfigError, match=r"train\.max_steps: must be an integer, got '1\.5e3x'"):
        load_finetune_config(cfg_file, ["train.max_steps=1.5e3x"])


def test_config_choices_are_the_shared_definitions():
    """Exit rules, methods, core modes and tasks come from their one definition (pondernet, core_modes, glue)."""
    from adaponder.core_modes import CORE_MODE_CHOICES
    from adaponder.palbert.config import FinetuneConfig
    from adaponder.palbert.glue import GLUE_TASKS
    from adaponder.palbert.pondernet import EXIT_RULES, METHODS

    rte = REPO / "configs/glue/rte.yaml"
    assert FinetuneConfig().eval.rules == FinetuneConfig().timing.rules == list(EXIT_RULES)
    for method in METHODS:
        assert load_finetune_config(rte, [f"model.method={method}"]).model.method == method
    for mode in CORE_MODE_CHOICES:
        assert load_finetune_config(rte, [f"model.core_mode={mode}"]).model.core_mode == mode
    for task in GLUE_TASKS:
        assert load_finetune_config(rte, [f"task={task}"]).task == task
    with pytest.raises(FinetuneConfigError) as err:  # PABEE models have no Lambda layer: no λ-based selection
        load_finetune_config(rte, ["model.method=pabee", "train.select_rule=q", "model.core_mode=pause"])
    assert "train.select_rule: must be null or one of pabee, last for method 'pabee'" in str(err.value)
    assert "model.core_mode: must be 'vanilla' | 'ponderlm' | 'loop' | 'adaponder' or null" in str(err.value)


def test_cli_reports_config_errors(tmp_path, capsys):
    from adaponder.cli.finetune_glue import main

    rc = main(["--config", str(REPO / "configs/glue/rte.yaml"), "--init", "tiny-random",
               "--set", "train.lr=-1", "--set", "model.passes=0", "--output", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2 and "train.lr: must be > 0" in err and "model.passes: must be >= 1, got 0" in err
    rc = main(["--config", str(REPO / "configs/glue/rte.yaml"), "--init", str(tmp_path / "nowhere")])
    assert rc == 2 and "no such checkpoint folder" in capsys.readouterr().err


def test_tokenizer_and_separator():
    tok = load_glue_tokenizer()
    assert tok.ids_of("<|endoftext|>") == [tok.eod_id] and tok.ids_of("") == []
    assert tok.ids_of("hello") == tok.encode("hello")


@pytest.mark.integration
def test_finetune_smoke_sst2_writes_every_exit_rule(worker, tmp_path, shared_data):
    rc, out = run_cli(worker, tmp_path, "sst2", ["train.save_model=true"])
    assert rc == 0
    res = json.loads((out / "results.json").read_text())
    assert res["complete"] and res["phases"] == ["train", "dev", "online", "timing"]
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
            lo, hi = t["speedup_iqr"]
            assert lo <= t["measured_speedup"] <= hi and t["rounds"] == 1  # timing.repeats=1
            assert t["above_ideal"] == (t["measured_speedup"] > t["ideal_speedup"] * (1 + 1e-9))
    assert res["timing"]["budget_seconds"] == 60 and res["timing"]["examples_timed"] == {"batch_1": 8, "batch_8": 8}
    table = (out / "results.md").read_text()
    for name in ("Q-exit", "sampling", "expectation", "always-last", "PABEE", "ms/example @1", "ms/example @8",
                 "majority class"):
        assert name in table
    assert table == results_markdown(res)
    assert (out / "model" / "config.json").is_file()


@pytest.mark.integration
def test_finetune_smoke_rte_pabee_baseline_from_checkpoint(worker, tmp_path, shared_data):
    """A sentence-pair task, the PABEE baseline, and --init from a GPT-NeoX checkpoint directory."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    torch.manual_seed(0)
    ckpt = tmp_path / "neox"
    GPTNeoXForCausalLM(GPTNeoXConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                     intermediate_size=64, vocab_size=50304)).save_pretrained(ckpt)
    rc, out = run_cli(worker, tmp_path, "rte", ["model.method=pabee", "model.passes=3", "data.max_length=64",
                                                "timing.enabled=false"], init=str(ckpt))
    assert rc == 0
    res = json.loads((out / "results.json").read_text())
    assert res["method"] == "pabee" and res["core_mode"] == "loop" and res["select_rule"] == "pabee"
    assert set(res["dev"]["rules"]) == {"pabee", "last"} and res["timing"] is None
    assert res["online"]["exit_agreement"] == 1.0


@pytest.mark.integration
def test_finetune_smoke_stsb_regression(worker, tmp_path, shared_data):
    rc, out = run_cli(worker, tmp_path, "stsb", ["data.max_length=64", "timing.batch_sizes=[4]"])
    assert rc == 0
    res = json.loads((out / "results.json").read_text())
    assert res["main_metric"] == "combined_score" and res["majority_baseline"] is None
    for st in res["dev"]["rules"].values():
        assert set(st["metrics"]) == {"pearson", "spearmanr", "combined_score"}
    assert res["online"]["exit_agreement"] == 1.0


@pytest.mark.integration
def test_cli_runs_as_a_script(tmp_path, shared_data):
    """The launcher as users call it (fresh interpreter, argument parsing, exit code)."""
    out = tmp_path / "wnli"
    proc = subprocess.run([sys.executable, str(REPO / "launch" / "finetune_glue.py"), "--config",
                           str(REPO / "configs/glue/wnli.yaml"), "--init", "tiny-random", "--output", str(out),
                           *sets(*SMOKE, "timing.enabled=false", "eval.rules=[q, last]")],
                          capture_output=True, text=True, timeout=600, env=cpu_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads((out / "results.json").read_text())
    assert set(res["dev"]["rules"]) == {"q", "last"}
    assert "Q-exit" in proc.stdout


@pytest.mark.slow
@pytest.mark.deepspeed
def test_finetune_under_deepspeed_two_ranks(tmp_path, shared_data):
    """Data parallel through DeepSpeed's engine (ZeRO stage 0, gloo on CPU): two ranks each take half of
    every batch of 32 and half of the dev set; rank 0 writes the results."""
    out = tmp_path / "ds"
    code, log = deepspeed_finetune(finetune_argv("sst2", out, "timing.enabled=false", "eval.rules=[q, last]"), 2,
                                   free_port())
    assert code == 0, log[-4000:]
    res = json.loads((out / "results.json").read_text())
    assert res["train"]["world_size"] == 2 and res["train"]["steps"] == 2
    assert set(res["dev"]["rules"]) == {"q", "last"}
