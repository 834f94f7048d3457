"""The one front door: ``adaponder COMMAND``, configs by name, the GLUE presets as one recipe, the study's training
started through the package."""

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from conftest import REPO


def _adaponder(*argv, cwd=None, timeout=120):
    from adaponder.resources import module_command, package_env

    return subprocess.run(module_command("adaponder.cli.main", list(argv)), cwd=cwd or REPO, env=package_env(),
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.integration
def test_help_lists_every_command_on_one_line_each_before_torch_loads(tmp_path):
    from adaponder.cli.main import COMMANDS

    code = ("import sys; from adaponder.cli.main import main; rc = main(['--help']); "
            "print('torch loaded' if 'torch' in sys.modules else 'no torch'); sys.exit(rc)")
    from adaponder.resources import package_env

    p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=package_env(), capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].startswith("usage: adaponder COMMAND") and lines[-1] == "no torch"
    wanted = {"prepare", "pretrain", "finetune", "eval", "perplexity", "difficulty", "dial", "halting", "report",
              "export", "plan", "study", "bench"}
    assert wanted <= {c.name for c in COMMANDS}
    for c in COMMANDS:
        listed = [ln for ln in lines if ln.split()[:1] == [c.name]]
        assert len(listed) == 1 and c.summary in listed[0], (c.name, lines)


def test_every_command_runs_a_cli_main_and_every_old_script_is_an_alias():
    from adaponder.cli.main import COMMANDS

    scripts = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"]
    assert scripts["adaponder"] == "adaponder.cli.main:main"
    aliases = {c.alias: f"adaponder.cli.{c.module}:main" for c in COMMANDS if c.alias}
    assert {k: v for k, v in scripts.items() if k != "adaponder"} == aliases
    for c in COMMANDS:
        assert callable(c.entry()), c.name


@pytest.mark.integration
def test_a_subcommand_is_named_as_typed_and_a_typo_gets_the_closest_name():
    p = _adaponder("plan", "--help")
    assert p.returncode == 0 and p.stdout.startswith("usage: adaponder plan "), p.stdout[:300]
    p = _adaponder("pretrian", "--config", "tiny")
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.strip() == ("error: adaponder: unknown command 'pretrian'; did you mean pretrain? "
                                "(adaponder --help lists them)")


@pytest.mark.parametrize("name, family, expected", [
    ("tiny", None, "configs/tiny.yaml"),
    ("reasoning", "study", "configs/study/reasoning.yaml"),
    ("study/reasoning.yaml", "study", "configs/study/reasoning.yaml"),
    ("configs/study/cpu.yaml", "study", "configs/study/cpu.yaml"),
    ("rte", "glue", "configs/glue/rte.yaml"),
    ("base", "glue", "configs/glue/base.yaml"),
])
def test_configs_are_found_by_name_from_any_folder(name, family, expected, tmp_path, monkeypatch):
    from adaponder.resources import find_config

    monkeypatch.chdir(tmp_path)
    assert find_config(name, family).resolve() == (REPO / expected).resolve()


def test_glue_task_presets_are_the_task_over_one_recipe():
    from adaponder.palbert.config import load_finetune_config
    from adaponder.palbert.glue import GLUE_TASKS
    from adaponder.strict_yaml import load_yaml

    glue = REPO / "configs" / "glue"
    for task in GLUE_TASKS:
        raw = load_yaml((glue / f"{task}.yaml").read_text(encoding="utf-8"))
        assert raw == {"extends": "base.yaml", "task": task}
        assert load_finetune_config(glue / f"{task}.yaml") == load_finetune_config(glue / "base.yaml", [f"task={task}"])
    # a preset's keys lie over the base's, section by section
    cfg = load_finetune_config(glue / "rte.yaml", ["train.lr=1e-4"])
    assert cfg.train.lr == 1e-4 and cfg.train.lambda_lr == load_finetune_config(glue / "rte.yaml").train.lambda_lr


def test_extends_names_a_missing_or_circular_base(tmp_path):
    from adaponder.palbert.config import FinetuneConfigError, load_finetune_config

    (tmp_path / "a.yaml").write_text("extends: b.yaml\ntask: rte\n")
    (tmp_path / "b.yaml").write_text("extends: a.yaml\n")
    with pytest.raises(FinetuneConfigError, match="leads back to a file that extends it"):
        load_finetune_config(tmp_path / "a.yaml")
    (tmp_path / "c.yaml").write_text("extends: nowhere.yaml\ntask: rte\n")
    with pytest.raises(FinetuneConfigError, match=r"nowhere\.yaml does not exist"):
        load_finetune_config(tmp_path / "c.yaml")


@pytest.mark.integration
def test_finetune_takes_the_task_as_a_setting(tmp_path):
    """``--config base --task rte`` reads the recipe with the task set; the bad init is then the one error."""
    p = _adaponder("finetune", "--config", "base", "--task", "rte", "--init", str(tmp_path / "nowhere"),
                   "--output", str(tmp_path / "out"), cwd=tmp_path, timeout=300)
    assert p.returncode == 2 and "task: required" not in p.stderr, p.stderr[-2000:]
    assert str(tmp_path / "nowhere") in p.stderr


@pytest.mark.integration
def test_a_child_command_runs_this_copy_of_the_package(tmp_path):
    """The study starts each arm's training as ``python -m adaponder.cli.pretrain`` (never a path into a
    checkout), with the parent's adaponder first on the path whatever the working folder."""
    import adaponder
    from adaponder.resources import module_command, package_env

    cmd = module_command("adaponder.resources", [])
    assert cmd[:3] == [sys.executable, "-m", "adaponder.resources"]
    p = subprocess.run([sys.executable, "-c", "import adaponder; print(adaponder.__file__)"], cwd=tmp_path,
                       env=package_env(), capture_output=True, text=True, timeout=60)
    assert Path(p.stdout.strip()) == Path(adaponder.__file__)
    arms = (REPO / "adaponder" / "study" / "arms.py").read_text(encoding="utf-8")
    assert 'module_command("adaponder.cli.pretrain"' in arms and "launch" not in arms.split('"""', 2)[2]


@pytest.mark.integration
def test_bench_lists_the_benchmarks_of_the_checkout():
    p = _adaponder("bench")
    assert p.returncode == 0 and "  train " in p.stdout and "  inference " in p.stdout, p.stdout
    p = _adaponder("bench", "nope")
    assert p.returncode == 2 and p.stderr.startswith("error: adaponder bench: no benchmark 'nope'"), p.stderr
