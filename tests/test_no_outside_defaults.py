"""No data location defaults to a folder outside the checkout: with the variables unset, every
command that needs data says which flag or variable to set, and no code path builds a ``../shared`` path.
"""

import os
import re
import subprocess
import sys

import pytest

from conftest import REPO

VARS = ("ADAPONDER_EVAL_DATA", "ADAPONDER_HELDOUT_DATA", "ADAPONDER_GLUE_DIR", "ADAPONDER_SHARED_DATA")
# Variables still allowed an outside fallback (none now; $ADAPONDER_GLUE_DIR / --data-dir once had
# ../shared/data/glue). A name listed here is exempt from the checks below.
PENDING: set[str] = set()


def _env():
    env = {k: v for k, v in os.environ.items() if k not in VARS}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1", WANDB_MODE="disabled",
               TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    return env


def _run(*args, cwd):
    proc = subprocess.run([sys.executable, *args], cwd=str(cwd), env=_env(), capture_output=True, text=True,
                          timeout=300)
    return proc.returncode, proc.stdout + proc.stderr


def test_no_code_resolves_a_location_outside_the_checkout():
    # A path built in code: a string literal "shared" joined to a path, or a literal starting with ../shared
    # (usage examples in docstrings and comments name such folders as arguments; they are not defaults).
    pattern = re.compile(r"""(["']shared["']\s*/|/\s*["']shared\b|["']\.\./shared|=\s*\.\./shared)""")
    offenders = []
    for folder in ("adaponder", "launch", "eval", "scripts", "configs"):
        for path in (REPO / folder).rglob("*"):
            if path.suffix not in (".py", ".sh", ".yaml") or not path.is_file():
                continue
            rel = str(path.relative_to(REPO))
            for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                code = line.split("#", 1)[0]
                if pattern.search(code) and rel not in PENDING:
                    offenders.append(f"{rel}:{i}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


@pytest.mark.integration
def test_eval_tasks_without_their_folder_say_which_variable_to_set(tmp_path):
    # adaponder-eval (lm-eval's CLI) on a local task, with lm-eval's dummy model: the task's data is read first.
    code, out = _run("-m", "adaponder.cli.lm_eval", "--model", "dummy", "--tasks", "adaponder_piqa", "--limit", "1",
                     cwd=tmp_path)
    assert code != 0 and "no data folder for the AdaPonder eval tasks: set $ADAPONDER_EVAL_DATA=/path" in out


@pytest.mark.integration
def test_report_without_data_says_which_flag_or_variable_to_set(tmp_path):
    code, out = _run("-m", "adaponder.cli.report", str(tmp_path / "ckpt"), "--out", str(tmp_path / "r"),
                     cwd=tmp_path)
    assert code != 0 and "no held-out data: pass --data FILE/FOLDER" in out and "$ADAPONDER_HELDOUT_DATA" in out
    code, out = _run("-m", "adaponder.cli.report", str(tmp_path / "ckpt"), "--out", str(tmp_path / "r"),
                     "--data", str(tmp_path), cwd=tmp_path)
    assert code != 0 and "set ADAPONDER_EVAL_DATA=/path" in out and "--no-lm-eval" in out
    code, out = _run("-m", "adaponder.cli.perplexity", str(tmp_path / "ckpt"), cwd=tmp_path)
    assert code == 2 and "--data" in out


@pytest.mark.integration
def test_prepare_and_pretrain_need_explicit_data(tmp_path):
    code, out = _run("-m", "adaponder.cli.prepare", "-o", str(tmp_path / "o"), cwd=tmp_path)
    assert code == 2 and "give at least one INPUT, --bundled or --hf-dataset NAME" in out
    cfg = tmp_path / "c.yaml"
    cfg.write_text("model: {size: tiny}\ntrain: {steps: 1, grad_accum: 1}\n")
    code, out = _run(str(REPO / "launch" / "pretrain.py"), "--config", str(cfg), cwd=tmp_path)
    assert code == 2 and "data.path: required" in out


@pytest.mark.parametrize("var", ["ADAPONDER_EVAL_DATA"])
def test_the_variable_is_honoured(var, tmp_path, monkeypatch):
    import importlib.util

    spec = importlib.util.spec_from_file_location("adaponder_eval_utils", REPO / "eval" / "tasks" / "utils.py")
    utils = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(utils)
    monkeypatch.delenv(var, raising=False)
    with pytest.raises(FileNotFoundError, match="ADAPONDER_EVAL_DATA"):
        utils.data_dir()
    monkeypatch.setenv(var, str(tmp_path))
    assert utils.data_dir() == tmp_path and utils.data_dir("/x") == __import__("pathlib").Path("/x")


def test_glue_fine_tuning_without_data_says_which_flag_or_variable_to_set(monkeypatch):
    from adaponder.palbert.finetune import default_glue_dir
    from adaponder.palbert.glue import GlueDataError

    monkeypatch.delenv("ADAPONDER_GLUE_DIR", raising=False)
    monkeypatch.delenv("ADAPONDER_SHARED_DATA", raising=False)
    with pytest.raises(GlueDataError, match="--data-dir .* ADAPONDER_GLUE_DIR"):
        default_glue_dir()
    monkeypatch.setenv("ADAPONDER_GLUE_DIR", "/data/glue")
    assert default_glue_dir() == "/data/glue"
