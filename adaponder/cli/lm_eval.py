"""``adaponder-eval``: lm-eval's command line with the ``adaponder`` model registered.

Any ``lm_eval`` / ``lm-eval run`` arguments work. Conveniences on top:

* ``--model`` defaults to ``adaponder``;
* a checkpoint folder given as the first argument becomes ``checkpoint=...`` in ``--model_args``;
* ``--include_path`` defaults to the ``adaponder_*`` task folder (``eval/tasks``; shipped in the wheel too);
* after lm-eval's results table, the recurrence settings and the realised compute (mean exit pass, exit
  histogram, FLOPs per token and × one pass) are printed; they are also in the results JSON under
  ``config.adaponder``;
* ``--help`` lists these arguments and defaults first, then lm-eval's options (:mod:`adaponder.cli.lm_eval_help`);
* ``--tasks-path`` alone prints the task folder, for unmodified lm-eval:
  ``lm_eval --model hf ... --include_path "$(adaponder eval --tasks-path)"``;
* git's ``fatal: not a git repository`` (lm-eval records the working folder's commit) is kept off the console;
* a checkpoint folder that does not exist is one ``error:`` line (exit code 2), as is any user error
  (:mod:`adaponder.cli.errors`; ``--debug`` shows the traceback).

Examples::

    adaponder-eval runs/demo/hf --tasks adaponder_lambada_openai --limit 100 --batch_size 8
    adaponder-eval --model_args checkpoint=CKPT,tau=0.1,exit_rule=uniform \\
        --tasks adaponder_suite --num_fewshot 5 --output_path out/
    python -m adaponder.cli.lm_eval ...      # the same without the console script
"""

from __future__ import annotations

import contextlib
import difflib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from adaponder.cli.errors import EXIT_NONFINITE, UsageError, cli_main, require_checkpoint
from adaponder.cli.lm_eval_help import format_help
from adaponder.resources import task_dir


#: ``adaponder eval --tasks-path`` prints the task folder and exits (what unmodified ``lm_eval`` needs as its
#: ``--include_path``, wherever adaponder is installed).
TASKS_PATH_FLAG = "--tasks-path"


def default_task_path() -> Path | None:
    """The ``adaponder_*`` task folder: ``<repo>/eval/tasks`` in a checkout / editable install, the copy in the
    package's resources in an installed wheel (:func:`adaponder.resources.task_dir`)."""
    return task_dir()


def _has(argv: Sequence[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in argv)


def build_argv(argv: Sequence[str]) -> list[str]:
    """lm-eval arguments from ``adaponder-eval`` arguments (see module doc)."""
    argv = list(argv)
    ckpt = None
    if argv and not argv[0].startswith("-") and argv[0] not in ("run", "ls", "validate"):
        ckpt = argv.pop(0)
    if not (argv and argv[0] in ("ls", "validate")):
        if argv and argv[0] == "run":
            argv.pop(0)
        if not _has(argv, "--model"):
            argv = ["--model", "adaponder", *argv]
        if ckpt is not None:
            if _has(argv, "--model_args"):
                i = next(i for i, a in enumerate(argv) if a == "--model_args" or a.startswith("--model_args="))
                if argv[i] == "--model_args":
                    argv[i + 1] = f"checkpoint={ckpt},{argv[i + 1]}"
                else:
                    argv[i] = f"--model_args=checkpoint={ckpt},{argv[i].split('=', 1)[1]}"
            else:
                argv += ["--model_args", f"checkpoint={ckpt}"]
        argv = ["run", *argv]
    if not _has(argv, "--include_path") and (tasks := default_task_path()) is not None:
        argv += ["--include_path", str(tasks)]
    return argv


def _value(argv: Sequence[str], flag: str) -> str | None:
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def checkpoint_of(argv: Sequence[str]) -> str | None:
    """The checkpoint folder that lm-eval arguments (:func:`build_argv`'s output) give the ``adaponder`` model
    (``checkpoint=`` or ``pretrained=`` in ``--model_args``, ``k=v,...`` or JSON); None for another model."""
    if _value(argv, "--model") != "adaponder" or (model_args := _value(argv, "--model_args")) is None:
        return None
    if model_args.lstrip().startswith("{"):
        try:
            values = json.loads(model_args)
        except json.JSONDecodeError:
            return None  # lm-eval reports it
    else:
        values = dict(kv.split("=", 1) for kv in model_args.split(",") if "=" in kv)
    ckpt = values.get("checkpoint", values.get("pretrained"))
    return None if ckpt is None else str(ckpt)


def revision_of(argv: Sequence[str]) -> str | None:
    """``revision=`` in ``--model_args`` (``k=v,...`` form), the hub revision of a checkpoint given by id."""
    model_args = _value(argv, "--model_args") or ""
    if model_args.lstrip().startswith("{"):
        try:
            return json.loads(model_args).get("revision")
        except (json.JSONDecodeError, AttributeError):
            return None
    values = dict(kv.split("=", 1) for kv in model_args.split(",") if "=" in kv)
    return values.get("revision")


def _wants_help(argv: Sequence[str]) -> bool:
    """``-h``/``--help`` for a run (the default); ``ls``/``validate`` keep lm-eval's own help."""
    return any(a in ("-h", "--help") for a in argv) and not (argv and argv[0] in ("ls", "validate"))


@cli_main
def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    raw = list(sys.argv[1:] if argv is None else argv)
    if raw == [TASKS_PATH_FLAG]:  # for unmodified lm_eval: --include_path "$(adaponder eval --tasks-path)"
        tasks = default_task_path()
        if tasks is None:
            raise UsageError("the adaponder_* lm-eval tasks are not installed with this adaponder (no eval/tasks in "
                             "the checkout, no adaponder/_resources/eval_tasks in the package)")
        print(tasks)
        return 0
    if _wants_help(raw):
        tasks = default_task_path()
        print(format_help(None if tasks is None else str(tasks)))
        return 0
    args = build_argv(raw)
    if (ckpt := checkpoint_of(args)) is not None:
        # A missing folder would end in transformers' "Repo id must be ..." error; a hub id is resolved (or named
        # in one error offline) as init.backbone is.
        require_checkpoint(ckpt, revision=revision_of(args))

    # lm-eval (with torch and transformers under the model) takes seconds to import: the help and a missing
    # checkpoint answer before it loads
    from lm_eval._cli import HarnessCLI
    from lm_eval.utils import setup_logging

    from adaponder.evaluation.lm_eval_model import AdaPonderLM  # registers the "adaponder" model

    setup_logging()
    parser = HarnessCLI()
    saved = sys.argv
    sys.argv = ["adaponder-eval", *args]
    try:
        parsed = parser.parse_args()
    finally:
        sys.argv = saved
    check_limit(getattr(parsed, "limit", None))
    check_task_names(getattr(parsed, "tasks", None), getattr(parsed, "include_path", None))
    with quiet_git():
        parser.execute(parsed)
    for lm in AdaPonderLM.instances:
        print(lm.settings.banner())
        print("[adaponder] realised compute")
        for line in lm.summary_lines():
            print(f"  {line}")
    return _nonfinite_exit(AdaPonderLM.instances)


@contextlib.contextmanager
def quiet_git():
    """The block runs with a ``git`` first on ``PATH`` that is the real one with its stderr discarded.

    lm-eval records ``git describe --always`` of the working folder in its results (falling back to reading
    ``.git`` itself when git fails); outside a repository git's ``fatal: not a git repository`` reaches the console
    and reads as a failure of the run. The hash recorded is unchanged (the same git answers on stdout). Where no
    git is installed (lm-eval's fallback is then quiet already) or the wrapper cannot run, nothing is changed."""
    real = shutil.which("git")
    if real is None or os.name != "posix":
        yield
        return
    folder = tempfile.mkdtemp(prefix="adaponder-git-")
    wrapper = Path(folder) / "git"
    saved = os.environ.get("PATH")
    try:
        wrapper.write_text(f'#!/bin/sh\nexec {shlex.quote(real)} "$@" 2>/dev/null\n', encoding="utf-8")
        wrapper.chmod(0o755)
        try:  # a temporary folder mounted noexec: leave git as it is
            usable = subprocess.run([str(wrapper), "--version"], capture_output=True, timeout=30).returncode == 0
        except OSError:
            usable = False
        if usable:
            os.environ["PATH"] = folder + (os.pathsep + saved if saved else "")
        yield
    finally:
        if saved is None:
            os.environ.pop("PATH", None)
        else:
            os.environ["PATH"] = saved
        shutil.rmtree(folder, ignore_errors=True)


def check_limit(limit: float | None) -> None:
    """``--limit`` must be a count of examples >= 1 or a fraction in (0, 1): lm-eval reads 0 as no limit (every
    example) and fails on a negative one deep in its task code."""
    if limit is not None and not limit > 0:
        raise UsageError(f"--limit {limit:g}: expected a number of examples per task >= 1, or a fraction in (0, 1) of "
                         "each task (leave it out for every example)")


def check_task_names(tasks, include_path) -> None:
    """Every name in ``--tasks`` must be a task, group or tag lm-eval knows (or a YAML file): one ``error:`` line
    naming the unknown one and the closest known names, before any model loads."""
    from lm_eval.tasks import TaskManager  # lm-eval is heavy (seconds to import): only a run needs it

    names = [t.strip() for t in (tasks if isinstance(tasks, list) else str(tasks or "").split(",")) if t.strip()]
    names = [n for n in names if not Path(n).is_file()]
    if not names:
        return
    manager = TaskManager(include_path=include_path)
    known = set(manager.all_tasks)
    for name in names:
        if name not in known and not manager.match_tasks([name]):
            close = difflib.get_close_matches(name, sorted(known), n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else "; list them with: lm-eval ls tasks"
            raise UsageError(f"--tasks {name}: no such lm-eval task, group or tag{hint}")


def _nonfinite_exit(instances) -> int:
    """3 with one ``error:`` line when a model scored NaN/inf logits (its metrics mean nothing), else 0."""
    bad = [lm for lm in instances if getattr(lm, "nonfinite_scores", 0)]
    for lm in bad:
        print(f"error: {lm.checkpoint}: {lm.nonfinite_scores} scored request(s) had non-finite logits (NaN or "
              "inf); the metrics above are not valid (try --model_args dtype=float32)", file=sys.stderr, flush=True)
    return EXIT_NONFINITE if bad else 0


if __name__ == "__main__":
    sys.exit(main())
