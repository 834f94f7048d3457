"""``adaponder-eval --help`` documents adaponder-eval itself — the checkpoint argument, its default model and task
folder, the adaponder model's arguments — before the lm-eval options it passes through, and never repeats lm-eval's
``--model`` default (hf), which adaponder-eval does not use."""

from adaponder.cli import lm_eval
from adaponder.resources import task_dir


def _help(capsys, *argv):
    code = lm_eval.main(list(argv))
    out = capsys.readouterr().out
    assert code == 0
    return out


def test_help_documents_the_checkpoint_default_model_and_pass_through(capsys):
    out = _help(capsys, "--help")
    own, _, passed = out.partition("lm-eval options (passed through unchanged):")
    assert own.startswith("usage: adaponder-eval [CHECKPOINT]") and passed, out[:500]
    own, passed = " ".join(own.split()), " ".join(passed.split())  # argparse wraps to the terminal width
    for text in ("CHECKPOINT", "becomes checkpoint=CHECKPOINT in --model_args", "default: adaponder, not lm-eval's hf",
                 "revision=REV", "tau=TAU", "exit_rule=learned|uniform|geometric", str(task_dir()),
                 "--debug", "goes to lm-eval unchanged"):
        assert text in own, text
    for option in ("--tasks", "--num_fewshot", "--limit", "--batch_size", "--output_path"):  # lm-eval's own
        assert option in passed, option
    assert "Model name (default: hf)" not in " ".join(out.split()) and "adaponder-eval default: adaponder" in passed


def test_short_flag_and_help_after_a_checkpoint_give_the_same_help(capsys):
    full = _help(capsys, "--help")
    assert _help(capsys, "-h") == full
    assert _help(capsys, "runs/demo/hf", "--tasks", "adaponder_piqa", "--help") == full  # nothing is loaded
