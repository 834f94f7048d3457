"""``adaponder eval``'s help for unmodified lm-eval (``--tasks-path``) and its quiet git (the wheel's run of both, from
a folder outside the checkout, is ``tests/test_packaging.py``)."""

from __future__ import annotations

import os
import subprocess

import pytest

from conftest import REPO


def test_tasks_path_prints_the_task_folder_lm_eval_needs(capsys):
    from adaponder.cli.lm_eval import main
    from adaponder.resources import task_dir

    assert main(["--tasks-path"]) == 0
    printed = capsys.readouterr().out.strip()
    assert printed == str(task_dir()) and (task_dir() / "adaponder_piqa.yaml").is_file()


@pytest.mark.integration  # runs git
def test_git_inside_quiet_git_answers_on_stdout_and_says_nothing_on_stderr(tmp_path):
    from adaponder.cli.lm_eval import quiet_git

    path = os.environ.get("PATH")
    with quiet_git():
        outside = subprocess.run(["git", "describe", "--always"], cwd=tmp_path, capture_output=True, text=True)
        inside = subprocess.run(["git", "rev-parse", "--is-inside-work-tree"], cwd=REPO, capture_output=True,
                                text=True)
    assert outside.returncode != 0 and outside.stderr == ""  # lm-eval then reads .git itself: a quiet fallback
    if (REPO / ".git").exists():
        assert inside.stdout.strip() == "true"  # the real git's answers, unchanged
    assert os.environ.get("PATH") == path  # restored
    plain = subprocess.run(["git", "describe", "--always"], cwd=tmp_path, capture_output=True, text=True)
    assert "not a git repository" in plain.stderr  # what lm-eval printed before


def test_the_shipped_task_readme_says_once_that_the_data_folder_has_no_default():
    from adaponder.resources import task_dir

    text = (task_dir() / "README.md").read_text(encoding="utf-8")
    assert "There is no default location" in text
    env_lines = [ln for ln in text.splitlines() if "ADAPONDER_EVAL_DATA=" in ln]
    assert env_lines and not any("the default" in ln or "optional" in ln for ln in env_lines), env_lines
    # its lm-eval line works wherever adaponder is installed (eval/tasks exists in a checkout only)
    assert '--include_path "$(adaponder eval --tasks-path)"' in text and "--include_path eval/tasks" not in text
