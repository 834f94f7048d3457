"""adaponder.typed_config, the machinery under the training, study and fine-tuning configs: dataclass sections
validated by pydantic, YAML 1.1 numbers, ``--set`` overrides, and one error listing every problem with its
key path."""

from dataclasses import dataclass, field
from typing import Annotated, Literal

import pytest
import yaml
from pydantic import Field

from adaponder import typed_config as tc
from adaponder.typed_config import Count, Float, Int, StepsOrFraction, UnitFloat


@dataclass
class Section:
    lr: Annotated[Float, Field(gt=0)] = 3e-4
    steps: Count | None = None
    tokens: Int = 0
    warmup: StepsOrFraction = 0.01
    decay: Literal["cosine", "linear"] = "cosine"
    betas: Annotated[list[Annotated[Float, Field(ge=0, lt=1)]], Field(min_length=2, max_length=2)] = field(
        default_factory=lambda: [0.9, 0.95])
    k_max: UnitFloat = 0.1
    name: str = "run"
    flag: bool = False
    extra: dict = field(default_factory=dict)


class SectionError(tc.ConfigError):
    what = "the test configuration"


def _build(raw):
    problems, bad = [], set()
    return tc.build_section(Section, raw, "optim", problems, bad), problems, bad


def test_every_problem_is_reported_at_once_with_its_key_path():
    sec, problems, bad = _build({"lr": "fast", "steps": 2.5, "decay": "cosin", "flag": "maybe", "betas": 0.9,
                                 "warm": 1.0, "zzz": 1, "name": 3, "k_max": 2, "tokens": True})
    assert problems == [
        "optim.lr: must be a number, got 'fast'",
        "optim.steps: must be an integer or null, got 2.5",
        "optim.decay: must be 'cosine' | 'linear', got 'cosin'",
        "optim.flag: must be true or false, got 'maybe'",
        "optim.betas: must be a list of a number, got 0.9",
        "optim.warm: unknown key (did you mean warmup?)",
        "optim.zzz: unknown key (known: lr, steps, tokens, warmup, decay, betas, k_max, name, flag, extra)",
        "optim.name: must be a string, got 3",
        "optim.k_max: must be <= 1, got 2",
        "optim.tokens: must be an integer, got True",  # pydantic alone would read true as 1
    ]
    assert bad == {"optim.lr", "optim.steps", "optim.decay", "optim.flag", "optim.betas", "optim.name",
                   "optim.k_max", "optim.tokens"}  # unknown keys are not values
    assert sec == Section()  # offending keys keep their defaults

    err = SectionError(problems, "run.yaml")
    assert err.problems == problems and err.source == "run.yaml"
    assert str(err).splitlines() == ["10 problem(s) in the test configuration in run.yaml:",
                                     *[f"  - {p}" for p in problems]]
    assert isinstance(err, ValueError)


def test_limits_are_reported_with_the_bound_and_good_keys_are_kept():
    sec, problems, bad = _build({"lr": 0, "steps": 0, "betas": [0.9], "k_max": 0.5, "warmup": 1.5,
                                 "tokens": "3e11"})
    assert problems == [
        "optim.lr: must be > 0, got 0",
        "optim.steps: must be >= 1, got 0",
        "optim.betas: must hold at least 2 item(s), got [0.9]",
        "optim.warmup: a float is a fraction of training and must lie in [0, 1], got 1.5 "
        "(write an integer for a step count)",
    ]
    assert bad == {"optim.lr", "optim.steps", "optim.betas", "optim.warmup"}
    assert (sec.k_max, sec.tokens, sec.lr, sec.betas) == (0.5, 300_000_000_000, 3e-4, [0.9, 0.95])
    _, problems, _ = _build({"betas": [0.9, 1.5, 0.1], "warmup": -3})
    assert problems == ["optim.betas: must hold at most 2 item(s), got [0.9, 1.5, 0.1]",
                        "optim.warmup: must be >= 0, got -3"]
    _, problems, _ = _build({"betas": [0.9, 1.5]})
    assert problems == ["optim.betas: must be < 1, got 1.5"]


def test_a_section_that_is_not_a_mapping():
    problems, bad = [], set()
    assert tc.build_section(Section, [1, 2], "optim", problems, bad) == Section()
    assert problems == ["optim: must be a mapping of lr, steps, tokens, warmup, decay, betas, k_max, name, flag, "
                        "extra, got list"]
    assert bad == {"optim"}
    assert tc.build_section(Section, None, "optim", problems) == Section()  # an empty YAML section


def test_validate_sections_reports_unknown_sections_with_the_field_errors():
    problems, bad = [], set()
    out = tc.validate_sections({"optim": {"lr": -1}, "optimm": {}, "model": {"any": 1}, "zzz": 1},
                               {"optim": Section, "other": Section}, problems, bad, others=("model",))
    assert problems == ["optimm: unknown section (did you mean optim?)",
                        "zzz: unknown section (known: optim, other, model)",
                        "optim.lr: must be > 0, got -1"]
    assert bad == {"optim.lr"} and out == {"optim": Section(), "other": Section()}


def test_yaml_1_1_exponent_strings_are_numbers(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("optim:\n  lr: 1e-3\n  tokens: 3e11\n  steps: 1e2\n  warmup: 1e-1\n  betas: [0.9, 9.5e-1]\n")
    raw = tc.read_yaml(path)
    assert raw["optim"]["lr"] == "1e-3" and raw["optim"]["tokens"] == "3e11"  # what PyYAML (YAML 1.1) gives
    sec, problems, _ = _build(raw["optim"])
    assert problems == []
    assert sec.lr == 1e-3 and isinstance(sec.lr, float)
    assert sec.tokens == 300_000_000_000 and isinstance(sec.tokens, int)
    assert sec.steps == 100 and isinstance(sec.steps, int)
    assert sec.warmup == 0.1 and isinstance(sec.warmup, float)
    assert sec.betas == [0.9, 0.95]


def test_integral_floats_are_integers_and_others_are_not():
    assert tc.coerce(3.0e11, Int) == 300_000_000_000 and isinstance(tc.coerce(3.0e11, Int), int)
    assert tc.coerce("8.0", Int) == 8 and isinstance(tc.coerce("8.0", Int), int)
    assert tc.coerce(7, Float) == 7.0 and isinstance(tc.coerce(7, Float), float)
    for value in (2.5, float("inf"), float("nan"), "2.5", "ten", True, None, [1]):
        with pytest.raises(ValueError, match="must be an integer"):
            tc.coerce(value, Int)
    with pytest.raises(ValueError, match="must be a number, got True"):
        tc.coerce(True, Float)


def test_steps_or_fraction_keeps_what_was_written():
    for written, value, kind in ((10, 10, int), ("10", 10, int), (0, 0, int), (0.1, 0.1, float),
                                 ("1e-1", 0.1, float), (1.0, 1.0, float)):  # 1.0 is all of training, not step 1
        got = tc.coerce(written, StepsOrFraction)
        assert got == value and type(got) is kind, written
    for value in (True, "ten", [1], None):
        with pytest.raises(ValueError, match="must be an integer or a number"):
            tc.coerce(value, StepsOrFraction)


def test_optional_literal_list_dict_and_type_names():
    assert tc.coerce(None, Int | None) is None
    with pytest.raises(ValueError, match="must be an integer, got None"):
        tc.coerce(None, Int)
    assert tc.coerce(("a", "b"), list[str]) == ["a", "b"]
    assert tc.coerce({"a": 1}, dict) == {"a": 1}
    with pytest.raises(ValueError, match="must be a string, got 3"):
        tc.coerce(3, str)
    assert tc.type_name(Count | None) == "an integer or null"
    assert tc.type_name(Literal["a", "b"]) == "'a' | 'b'"
    assert tc.type_name(list[Float]) == "a list of a number"


def test_set_overrides_parse_as_yaml_and_nest():
    raw = {"optim": {"lr": 1.0}, "train": 5}
    out = tc.apply_overrides(raw, ["optim.lr=3e-4", "optim.betas=[0.8, 0.9]", "train.steps=100",
                                   "model.size=70m", "eval.note=a=b", "data.path=", "x.y=[1,"])
    assert raw == {"optim": {"lr": 1.0}, "train": 5}  # the input is not modified
    assert out["optim"] == {"lr": "3e-4", "betas": [0.8, 0.9]}  # "3e-4" becomes a number when validated
    assert out["train"] == {"steps": 100}  # a non-mapping on the path is replaced
    assert out["model"] == {"size": "70m"}
    assert out["eval"] == {"note": "a=b"}  # split at the first "="
    assert out["data"] == {"path": None}  # empty value = null
    assert out["x"] == {"y": "[1,"}  # not valid YAML: kept as written
    assert tc.parse_override(" a.b = 1") == (["a", "b"], 1)
    sec, problems, _ = _build(tc.apply_overrides({}, ["optim.lr=3e-4", "optim.warmup=10"])["optim"])
    assert problems == [] and sec.lr == 3e-4 and sec.warmup == 10 and isinstance(sec.warmup, int)


@pytest.mark.parametrize("item,message", [("optim.lr", "--set 'optim.lr': expected key.path=value"),
                                          ("=3", "--set '=3': empty key"),
                                          ("...=3", "--set '...=3': empty key")])
def test_set_parsing_errors_name_the_item_in_the_callers_error(item, message):
    with pytest.raises(SectionError) as err:
        tc.apply_overrides({}, ["ok.key=1", item], SectionError)
    assert err.value.problems == [message]
    assert str(err.value).startswith("1 problem(s) in the test configuration:")


def test_read_yaml_errors_name_the_file(tmp_path):
    with pytest.raises(SectionError) as err:
        tc.read_yaml(tmp_path / "missing.yaml", SectionError)
    assert err.value.problems == [f"config file {tmp_path / 'missing.yaml'} does not exist"]
    assert err.value.source == str(tmp_path / "missing.yaml")

    bad = tmp_path / "bad.yaml"
    bad.write_text("optim: [1,\n")
    with pytest.raises(tc.ConfigError) as err:
        tc.read_yaml(bad)
    assert err.value.problems[0].startswith("not valid YAML:") and f"in {bad}:" in str(err.value)

    listing = tmp_path / "list.yaml"
    listing.write_text(yaml.safe_dump([1, 2]))
    with pytest.raises(tc.ConfigError, match="the file must hold a mapping of sections, got list"):
        tc.read_yaml(listing)

    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert tc.read_yaml(empty) == {}
