"""``--help`` states defaults: GLUE fine-tuning lists its recipe's values (what ``--set`` changes), the commands on
:class:`adaponder.cli.doc.DefaultsHelpFormatter` show each option's default once."""

from __future__ import annotations

import argparse
import re

import pytest
import yaml

from conftest import REPO


def test_finetune_help_lists_every_value_of_the_recipe(capsys):
    from adaponder.cli.finetune_glue import parse_args

    with pytest.raises(SystemExit) as stop:
        parse_args(["--help"])
    assert stop.value.code == 0
    text = capsys.readouterr().out
    epilog = " ".join(text.split("--set KEY=VALUE changes one:")[1].split())
    recipe = yaml.safe_load((REPO / "configs" / "glue" / "base.yaml").read_text())
    for section, values in recipe.items():
        for key, value in (values.items() if isinstance(values, dict) else [(None, values)]):
            name = section if key is None else f"{section}.{key}"
            assert re.search(rf"(^|, ){re.escape(name)}=", epilog), name
    assert "train.lr=2e-05" in epilog and "timing.budget_seconds=60" in epilog and "model.passes=4" in epilog


def test_the_formatter_shows_a_default_once_and_none_that_says_nothing():
    from adaponder.cli.doc import DefaultsHelpFormatter

    p = argparse.ArgumentParser(prog="x", formatter_class=DefaultsHelpFormatter)
    p.add_argument("--steps", type=int, default=1500, help="training steps")
    p.add_argument("--split", default="dev", help="the split (default dev)")
    p.add_argument("--cap", type=int, default=None, help="a cap")
    p.add_argument("--flag", action="store_true", help="a flag")
    p.add_argument("--set", action="append", default=[], help="overrides")
    text = " ".join(p.format_help().split())
    assert "training steps (default: 1500)" in text and "the split (default dev)" in text
    assert "(default: dev)" not in text and "(default: None)" not in text and "(default: False)" not in text
    assert "(default: [])" not in text
