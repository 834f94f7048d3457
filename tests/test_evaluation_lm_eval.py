"""lm-eval two ways on a saved checkpoint: unmodified ``lm_eval --model hf`` with
``trust_remote_code`` and ``adaponder-eval`` (``python -m adaponder.cli.lm_eval``, the registered
``adaponder`` model) give identical metrics; the ``adaponder`` model pins K, τ and the exit rule and reports the
realised compute."""

import json
import subprocess
import sys

import pytest

from adaponder.modeling.run_settings import DEFAULT_TAU
from conftest import REPO, SHARED_DATA
from helpers_evaluation import subprocess_env, tiny_checkpoint

TASK = "adaponder_lambada_openai"


def test_fixture_checkpoint_round_trips(tmp_path_factory):
    from adaponder.modeling import AdaPonderForCausalLM

    path = tiny_checkpoint(tmp_path_factory)
    model = AdaPonderForCausalLM.from_pretrained(path)
    assert "halting_threshold" not in model.config.to_dict()  # τ is a setting of each call, not saved
    assert model.config.passes == 4 and len(model.gates) == 3
    assert (path / "tokenizer.json").is_file()


@pytest.fixture(scope="module")
def task_manager():
    from lm_eval.tasks import TaskManager

    if not (SHARED_DATA / "eval" / "lambada_openai").is_dir():
        pytest.skip(f"eval data not found under {SHARED_DATA}")
    return TaskManager(include_path=str(REPO / "eval" / "tasks"))


def _run(model, model_args, task_manager, limit=10):
    from lm_eval import simple_evaluate

    return simple_evaluate(model=model, model_args=model_args, tasks=[TASK], limit=limit, batch_size=4,
                           device="cpu", task_manager=task_manager, random_seed=0, numpy_random_seed=0,
                           torch_random_seed=0, fewshot_random_seed=0, bootstrap_iters=100)


@pytest.mark.integration
def test_adaponder_model_reports_realised_compute(tmp_path_factory, task_manager):
    import adaponder.evaluation.lm_eval_model  # noqa: F401  (registers "adaponder")

    ckpt = tiny_checkpoint(tmp_path_factory)
    ap = _run("adaponder", f"checkpoint={ckpt}", task_manager)
    assert ap["results"][TASK]["sample_len"] == 10
    # the adaponder model reports what it spent: one scored position per LAMBADA target token
    info = ap["config"]["adaponder"]
    assert info["settings"]["tau"] == DEFAULT_TAU and info["settings"]["passes"] == 4
    scored = info["scored"]
    assert scored["tokens"] >= 10 and sum(scored["exit_histogram"]) == scored["tokens"]
    assert 1.0 <= scored["mean_exit_pass"] <= 4.0
    assert scored["flops_per_token"]["x_one_pass"] >= 1.0
    assert info["input"]["tokens"] > scored["tokens"]


@pytest.mark.integration
def test_adaponder_model_pins_settings_and_fixed_pruning(tmp_path_factory, task_manager):
    from adaponder.evaluation.lm_eval_model import AdaPonderLM

    ckpt = tiny_checkpoint(tmp_path_factory)
    lm = AdaPonderLM(checkpoint=str(ckpt), passes="3", tau="0.01", exit_rule="geometric", target_mean_exit="2.0",
                     batch_size=4, device="cpu")
    assert lm.model.config.passes == 3 and lm.settings.tau == 0.01 and lm.run_settings.tau == 0.01
    assert lm.settings.exit_rule == "geometric" and lm.settings.target_mean_exit == 2.0
    res = _run(lm, None, task_manager, limit=20)
    inputs = res["config"]["adaponder"]["input"]
    assert len(inputs["exit_histogram"]) == 3
    assert abs(inputs["mean_exit_pass"] - 2.0) / 2.0 < 0.05  # ≈ 2k tokens: sampling noise only
    with pytest.raises(ValueError):
        AdaPonderLM(checkpoint=str(ckpt), passes=5, device="cpu")  # only 3 gates: K <= 4


def _cli(args, tmp_path, name):
    out = subprocess.run([sys.executable, "-m", *args, "--tasks", TASK, "--limit", "10", "--batch_size", "4",
                          "--device", "cpu", "--output_path", str(tmp_path / name)],
                         cwd=REPO, env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    (result,) = list((tmp_path / name).rglob("results_*.json"))
    return out.stdout, json.loads(result.read_text())


@pytest.mark.integration
def test_lm_eval_hf_cli_and_adaponder_eval_cli_agree(tmp_path_factory, tmp_path, task_manager):
    """The two command lines of the README: unmodified ``lm_eval --model hf`` and ``adaponder-eval``."""
    ckpt = tiny_checkpoint(tmp_path_factory)
    _, hf = _cli(["lm_eval", "--model", "hf", "--model_args", f"pretrained={ckpt},trust_remote_code=True",
                  "--include_path", str(REPO / "eval" / "tasks")], tmp_path, "hf")
    stdout, ap = _cli(["adaponder.cli.lm_eval", str(ckpt)], tmp_path, "ap")
    for key in ("acc,none", "perplexity,none"):
        assert hf["results"][TASK][key] == ap["results"][TASK][key], key
    assert f"halting threshold τ: {DEFAULT_TAU:g}" in stdout and "mean exit pass" in stdout and "x one pass" in stdout
    assert ap["config"]["model"] == "adaponder" and ap["config"]["adaponder"]["scored"]["tokens"] >= 10


def test_cli_argument_building():
    from adaponder.cli.lm_eval import build_argv

    argv = build_argv(["CKPT", "--tasks", "t", "--model_args", "tau=0.1"])
    assert argv[:3] == ["run", "--model", "adaponder"]
    assert argv[argv.index("--model_args") + 1] == "checkpoint=CKPT,tau=0.1"
    assert "--include_path" in argv
    argv = build_argv(["--model", "hf", "--model_args", "pretrained=X", "--include_path", "p"])
    assert argv[argv.index("--model") + 1] == "hf" and argv.count("--include_path") == 1


@pytest.mark.integration
def test_adaponder_model_runs_q_exit_and_the_calibrated_consistency_exit(tmp_path_factory, task_manager):
    """lm-eval with each exit rule that reads the model's heads (docs/method.md A21, A23): ``exit_rule=q-exit``
    stops every token where the halting heads' exit distribution first passes q; ``exit_rule=consistency`` reads
    the threshold that ``adaponder calibrate`` wrote next to the checkpoint."""
    import adaponder.evaluation.lm_eval_model  # noqa: F401  (registers "adaponder")
    from helpers_evaluation import WIKITEXT, tiny_model, tiny_tokenizer

    path = tmp_path_factory.mktemp("heads") / "ponderlm-heads"
    tiny_model(mode="ponderlm", halting_heads=True, consistency_heads=True).save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    # untrained halting heads: λ = 0.1 each pass, so Σ p = 0.1, 0.19, 0.271: q = 0.15 stops every token after pass 2
    res = _run("adaponder", f"checkpoint={path},exit_rule=q-exit,q=0.15", task_manager)
    info = res["config"]["adaponder"]
    assert info["settings"]["exit_rule"] == "q-exit" and info["settings"]["q"] == 0.15
    assert info["scored"]["exit_histogram"] == [0, info["scored"]["tokens"], 0, 0]
    with pytest.raises(Exception, match="adaponder calibrate"):  # no calibration yet: one clear error
        _run("adaponder", f"checkpoint={path},exit_rule=consistency", task_manager)
    out = subprocess.run([sys.executable, "-m", "adaponder.cli.main", "calibrate", str(path), "--data", str(WIKITEXT),
                          "--split", "val", "--max-tokens", "2048", "--window", "32", "--delta", "0.05"],
                         cwd=REPO, env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    calibration = json.loads((path / "exit_calibration.json").read_text())
    assert calibration["delta"] == 0.05 and calibration["windows"] > 0
    res = _run("adaponder", f"checkpoint={path},exit_rule=consistency", task_manager)
    settings = res["config"]["adaponder"]["settings"]
    assert settings["exit_rule"] == "consistency"
    assert settings["consistency_threshold"] == calibration["threshold"]
