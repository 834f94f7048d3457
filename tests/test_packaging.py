"""The README's "Install as a package (wheel)" section works as written, from a folder outside the repository.

The test reads the fenced block after the README's ``<!-- wheel-install: ... -->`` marker and runs it with bash,
line by line as a user would (``HOME`` is a temporary folder, so ``~/adaponder-env`` and ``~/adaponder-try`` land
there; the repository is a copy). It runs offline, so four lines are substituted, each for a stated reason:

* ``pip wheel ...`` gets ``--no-build-isolation``: an isolated build would download setuptools;
* ``pip install torch==...`` becomes a ``.pth`` file that lets the fresh environment see this environment's
  site-packages (torch and every other dependency, nothing downloaded); the test then checks that the torch
  the environment imports is the version the line pins;
* ``pip install dist/adaponder-*.whl ...`` gets ``--no-deps --no-index`` (the dependencies come through the
  ``.pth``; the wheel itself is installed for real, non-editable);
* ``adaponder pretrain ...`` gets ``--set`` overrides after the README's for a 2-step run of short sequences, and
  ``adaponder eval ...`` is skipped when the offline evaluation data are missing;
* ``lm_eval ...`` becomes ``python -m lm_eval ...`` (the fresh environment's Python): lm-eval comes through the
  ``.pth``, so its console script is not in the fresh environment's ``bin`` as it is after a real install (skipped,
  like ``adaponder eval``, without the evaluation data).

The script's stderr goes to its stdout, so each line's output follows its echoed command in order.

``adaponder --help`` and ``adaponder study --config reasoning --profile quick`` run as written: the study finds its
config by name in the wheel and trains each arm through the package (``python -m adaponder.cli.pretrain``).

``python3`` on the ``PATH`` is this interpreter. Afterwards every console script of ``pyproject.toml``'s
``[project.scripts]`` answers ``--help`` with exit code 0 from the folder outside the repository, and the README's
``adaponder calibrate`` line runs there on the bundled corpus the block prepared (finished, then stopped by Ctrl-C).
"""

import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from conftest import REPO, SHARED_DATA

pytestmark = pytest.mark.slow

MARKER = "<!-- wheel-install:"
_TOP_SKIP = {".venv", ".git", "runs", "data", "build", "dist", ".pytest_cache", "wandb", "outputs"}
FAST_PRETRAIN = ["train.steps=2", "train.micro_batch=2", "train.global_batch=2", "train.threads=1", "data.seq_len=64",
                 "eval.max_batches=1", "eval.micro_batch=2", "eval.report=false", "logging.progress_bar=false",
                 "logging.every=1"]


def readme_wheel_block() -> list[str]:
    """The command lines of the README's wheel section (comments and blank lines dropped)."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert MARKER in text, f"README.md has no {MARKER} marker before its wheel-install block"
    block = text.split(MARKER, 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    lines = [re.sub(r"\s+#\s.*$", "", ln).strip() for ln in block.splitlines()]  # trailing comments too
    return [ln for ln in lines if ln and not ln.startswith("#")]


def console_scripts() -> list[str]:
    return list(tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"])


def offline_line(line: str, have_eval_data: bool) -> str:
    """``line`` as the offline test runs it (the substitutions of the module doc)."""
    words = line.split()
    if words[:2] == ["pip", "wheel"]:
        return line + " --no-build-isolation"
    if re.search(r"bin/pip install torch==", line):
        env = words[0].rsplit("/bin/pip", 1)[0]
        deps = sysconfig.get_paths()["purelib"]
        return (f"{env}/bin/python -c \"import pathlib, sysconfig; pathlib.Path(sysconfig.get_paths()['purelib'], "
                f"'_adaponder_test_deps.pth').write_text('{deps}\\n')\"")
    if re.search(r"bin/pip install dist/adaponder-", line):
        return line + " --no-deps --no-index"
    if words[:2] == ["adaponder", "pretrain"]:
        return line + "".join(f" --set {s}" for s in FAST_PRETRAIN)
    if words[:2] == ["adaponder", "eval"] and not have_eval_data:
        return "echo 'skipped: adaponder eval (no offline evaluation data)'"
    if words[0] == "lm_eval":
        return "python -m " + line if have_eval_data else "echo 'skipped: lm_eval (no offline evaluation data)'"
    if words[:2] == ["adaponder", "study"]:  # its training children inherit one thread (OMP_NUM_THREADS)
        return line
    return line


def _copy_repo(dest: Path) -> Path:
    def ignore(folder, names):
        top = Path(folder) == REPO
        return [n for n in names if (top and n in _TOP_SKIP) or n == "__pycache__" or n.endswith((".egg-info", ".pyc"))]

    shutil.copytree(REPO, dest, ignore=ignore)
    return dest


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    root = tmp_path_factory.mktemp("wheel")
    src = _copy_repo(root / "src")
    home = root / "home"
    home.mkdir()
    have_eval = (SHARED_DATA / "eval" / "piqa").is_dir()
    lines = readme_wheel_block()
    script = ["set -euo pipefail", "exec 2>&1", f"cd {src}"]
    for ln in lines:  # each line echoed as written, then run (substituted where the module doc says)
        script += [f"echo {shlex.quote('+ ' + ln)}", offline_line(ln, have_eval)]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(HOME=str(home), PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
               HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1", WANDB_MODE="disabled",
               TOKENIZERS_PARALLELISM="false", DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", PIP_NO_INPUT="1",
               ADAPONDER_EVAL_DATA=str(SHARED_DATA / "eval"))
    proc = subprocess.run(["bash", "-c", "\n".join(script)], env=env, capture_output=True, text=True, timeout=900)
    venv = home / "adaponder-env"
    return {"lines": lines, "code": proc.returncode, "out": proc.stdout + proc.stderr, "venv": venv,
            "py": venv / "bin" / "python", "work": home / "adaponder-try", "env": env, "have_eval": have_eval,
            "wheel": next((src / "dist").glob("adaponder-*.whl"), None)}


def _output_of(installed, start: str) -> str:
    """What the README line starting with ``start`` printed (the script echoes ``+ LINE`` before each line)."""
    parts = installed["out"].split("\n+ ")
    return next(part for part in parts if part.startswith(start))


def _run(installed, *argv, timeout=600):
    exe = installed["venv"] / "bin" / argv[0]
    proc = subprocess.run([str(exe), *argv[1:]], cwd=str(installed["work"]), env=installed["env"],
                          capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stdout + proc.stderr


def test_readme_wheel_section_runs_as_written(installed):
    assert installed["code"] == 0, installed["out"][-5000:]
    out, work = installed["out"], installed["work"]
    assert (work / "data" / "bundled" / "meta.json").is_file()
    assert (work / "runs" / "tiny" / "hf" / "config.json").is_file() and "MFU peak:" in out
    assert "usage: adaponder COMMAND" in out and "  study " in out  # adaponder --help
    # the study from the wheel: config by name, every arm trained through the package, the report written
    report = work / "runs" / "study-reasoning-quick" / "study.md"
    assert report.is_file() and "adaponder.cli.pretrain --config" in out, out[-3000:]
    assert "site-packages/launch" not in out and "can't open file" not in out
    if installed["have_eval"]:
        assert "adaponder_piqa" in out and "[adaponder] realised compute" in out
        # the README's line for unmodified lm-eval: the task folder found through `adaponder eval --tasks-path`
        ran = _output_of(installed, "lm_eval ")
        assert "Tasks not found" not in ran and re.search(r"\|\s*adaponder_piqa\s*\|", ran), ran[-3000:]
        # lm-eval's `git describe` outside a repository: kept off the console by adaponder eval
        assert "fatal:" not in _output_of(installed, "adaponder eval "), _output_of(installed, "adaponder eval ")
    pinned = next(re.search(r"torch==(\S+)", ln).group(1) for ln in installed["lines"] if "install torch==" in ln)
    code, version = _run(installed, "python", "-c", "import torch; print(torch.__version__.split('+')[0])")
    assert code == 0 and version.strip().splitlines()[-1] == pinned


def test_wheel_ships_resources_and_is_what_runs(installed):
    import zipfile

    assert installed["wheel"] is not None, installed["out"][-3000:]
    names = zipfile.ZipFile(installed["wheel"]).namelist()
    for needed in ("adaponder/data/indexed.py", "adaponder/train/trainer.py", "adaponder/cli/pretrain.py",
                   "adaponder/_resources/eval_tasks/adaponder_suite.yaml", "adaponder/_resources/eval_tasks/utils.py",
                   "adaponder/_resources/configs/tiny.yaml", "adaponder/_resources/configs/pythia2.8b-continue.yaml",
                   "adaponder/_resources/launch/finetune_glue.py", "adaponder/assets/corpus/11-0.txt.gz",
                   "adaponder/assets/tokenizer/gpt-neox-20b/tokenizer.json.gz"):
        assert needed in names, needed
    code, out = _run(installed, "python", "-c", "import adaponder, adaponder.resources as r; "
                     "print(adaponder.__file__); print(r.repo_root()); print(r.task_dir())")
    file, root, tasks = out.strip().splitlines()[-3:]
    assert code == 0 and file.startswith(str(installed["venv"])) and root == "None"
    assert tasks.endswith("adaponder/_resources/eval_tasks")


def test_every_console_script_answers_help_outside_the_repository(installed):
    scripts = console_scripts()
    assert len(scripts) == 15 and "adaponder" in scripts and all((installed["venv"] / "bin" / s).is_file() for s in scripts), scripts
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = dict(zip(scripts, pool.map(lambda s: _run(installed, s, "--help", timeout=300), scripts)))
    failed = {s: out[-1500:] for s, (code, out) in results.items() if code != 0 or "usage:" not in out}
    assert not failed, failed
    assert "CHECKPOINT" in results["adaponder-eval"][1]  # adaponder-eval's own help, not only lm-eval's


def test_readme_lists_every_command():
    from adaponder.cli.main import COMMANDS

    readme = (REPO / "README.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"^\| `adaponder ([a-z-]+)` \|", readme, flags=re.M))
    assert listed == {c.name for c in COMMANDS}
    # one form for every command: no console-script alias or launch/ shim run by python
    assert not re.search(r"^(adaponder-[a-z-]+|python launch/)", readme, flags=re.M)


def readme_calibrate_line() -> list[str]:
    """The README's ``adaponder calibrate CKPT --data PREPARED ...`` line (section Evaluation), as words."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    line = next(ln for ln in text.splitlines() if ln.startswith("adaponder calibrate CKPT "))
    return shlex.split(re.sub(r"\s+#\s.*$", "", line))


#: A ponderlm with consistency heads of the bundled tokenizer's vocabulary (none saved with it: the evaluation loads
#: the bundled one, the corpus's), written by the installed package.
CONSISTENCY_CHECKPOINT = """
import sys, torch
from adaponder.modeling import AdaPonderConfig, AdaPonderForCausalLM
torch.manual_seed(0)
AdaPonderForCausalLM(AdaPonderConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                                     vocab_size=50304, mode="ponderlm", passes=2, consistency_heads=True)
                     ).save_pretrained(sys.argv[1])
"""


def test_calibrate_runs_from_the_wheel_with_the_readme_flags_and_stops_cleanly_on_ctrl_c(installed):
    """On the bundled corpus prepared by the README's block: the README's flags alone (the default token cap) finish,
    with a progress bar; Ctrl-C during the calibration is one line, exit code 130, nothing written."""
    import json

    from helpers_evaluation import ctrl_c_while_calibrating

    assert installed["code"] == 0, installed["out"][-3000:]
    work = installed["work"]
    code, out = _run(installed, "python", "-c", CONSISTENCY_CHECKPOINT, "cal-ckpt")
    assert code == 0, out[-3000:]
    words = readme_calibrate_line()
    argv = [{"CKPT": "cal-ckpt", "PREPARED": "data/bundled"}.get(w, w) for w in words]
    assert argv[:2] == ["adaponder", "calibrate"] and "--max-tokens" not in argv  # the default cap applies
    code, out = _run(installed, *argv, timeout=1200)
    assert code == 0, out[-3000:]
    assert "calibrating (20 thresholds)" in out and "read the first 16384 tokens of split 'val'" in out
    saved = json.loads((work / "cal-ckpt" / "exit_calibration.json").read_text())
    assert saved["windows"] == 128 and saved["test"]["windows"] == 128  # 16,384 tokens in windows of 64, halved

    (work / "cal-ckpt" / "exit_calibration.json").unlink()
    exe = installed["venv"] / "bin" / "adaponder"
    code, _, text, lines = ctrl_c_while_calibrating([str(exe), *argv[1:]], str(work), installed["env"], timeout=600)
    assert code == 130 and "Traceback" not in text, text[-3000:]
    assert lines == ["adaponder calibrate: stopped by Ctrl-C; nothing was written"]
    assert not (work / "cal-ckpt" / "exit_calibration.json").exists()
