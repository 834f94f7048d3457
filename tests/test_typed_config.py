"""adaponder.typed_config, the machinery under the training and fine-tuning configs: typed sections, YAML 1.1
numbers, ``--set`` overrides, and one error listing every problem with its key path."""

from dataclasses import dataclass, field
from typing import Literal, Union

import pytest
import yaml

from adaponder import typed_config as tc


@dataclass
class Section:
    lr: float = 3e-4
    steps: int | None = None
    tokens: int = 0
    warmup: Union[int, float] = 0.01
    decay: Literal["cosine", "linear"] = "cosine"
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    name: str = "run"
    flag: bool = False
    extra: dict = field(default_factory=dict)


class SectionError(tc.ConfigError):
    what = "the test configuration"


def _build(raw):
    problems, bad = [], set()
    return tc.build_section(Section, raw, "optim", problems, bad), problems, bad


def test_every_problem_is_reported_at_once_with_its_key_path():
    sec, problems, bad = _build({"lr": "fast", "steps": 2.5, "decay": "cosin", "flag": "yes", "betas": 0.9,
                                 "warm": 1.0, "zzz": 1})
    assert problems == [
        "optim.lr: must be a number, got 'fast'",
        "optim.steps: must be an integer or null, got 2.5",
        "optim.decay: must be 'cosine' | 'linear', got 'cosin'",
        "optim.flag: must be true or false, got 'yes'",
        "optim.betas: must be a list of a number, got 0.9",
        "optim.warm: unknown key (did you mean warmup?)",
        "optim.zzz: unknown key (known: lr, steps, tokens, warmup, decay, betas, name, flag, extra)",
    ]
    assert bad == {"optim.lr", "optim.steps", "optim.decay", "optim.flag", "optim.betas"}  # unknown keys are not values
    assert sec == Section()  # offending keys keep their defaults

    err = SectionError(problems, "run.yaml")
    assert err.problems == problems and err.source == "run.yaml"
    assert str(err).splitlines() == ["7 problem(s) in the test configuration in run.yaml:",
                                     *[f"  - {p}" for p in problems]]
    assert isinstance(err, ValueError)


def test_a_section_that_is_not_a_mapping():
    problems, bad = [], set()
    assert tc.build_section(Section, [1, 2], "optim", problems, bad) == Section()
    assert problems == ["optim: must be a mapping of lr, steps, tokens, warmup, decay, betas, name, flag, extra, "
                        "got list"]
    assert bad == {"optim"}
    assert tc.build_section(Section, None, "optim", problems) == Section()  # an empty YAML section


def test_yaml_1_1_exponent_strings_are_numbers(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("optim:\n  lr: 1e-3\n  tokens: 3e11\n  warmup: 1e-1\n  betas: [0.9, 9.5e-1]\n")
    raw = tc.read_yaml(path)
    assert raw["optim"]["lr"] == "1e-3"  # what PyYAML (YAML 1.1) gives
    sec, problems, _ = _build(raw["optim"])
    assert problems == []
    assert sec.lr == 1e-3 and isinstance(sec.lr, float)
    assert sec.tokens == 300_000_000_000 and isinstance(sec.tokens, int)
    assert sec.warmup == 0.1 and isinstance(sec.warmup, float)
    assert sec.betas == [0.9, 0.95]


def test_integral_floats_are_integers_and_others_are_not():
    assert tc.coerce(3.0e11, int) == 300_000_000_000 and isinstance(tc.coerce(3.0e11, int), int)
    assert tc.coerce("8.0", int) == 8 and isinstance(tc.coerce("8.0", int), int)
    assert tc.coerce(7, float) == 7.0 and isinstance(tc.coerce(7, float), float)
    for value in (2.5, float("inf"), float("nan"), "2.5", True, None, [1]):
        with pytest.raises(ValueError, match="must be an integer"):
            tc.coerce(value, int)
    with pytest.raises(ValueError, match="must be a number, got True"):
        tc.coerce(True, float)


def test_steps_or_fraction_keeps_what_was_written():
    steps_or_fraction = Union[int, float]
    assert tc.coerce(10, steps_or_fraction) == 10 and isinstance(tc.coerce(10, steps_or_fraction), int)
    assert tc.coerce("10", steps_or_fraction) == 10 and isinstance(tc.coerce("10", steps_or_fraction), int)
    assert tc.coerce(0.1, steps_or_fraction) == 0.1
    assert tc.coerce("1e-1", steps_or_fraction) == 0.1
    assert isinstance(tc.coerce(1.0, steps_or_fraction), float)  # 1.0 is all of training, not step 1
    for value in (True, "ten", [1]):
        with pytest.raises(ValueError):
            tc.coerce(value, steps_or_fraction)


def test_optional_literal_list_dict_and_type_names():
    assert tc.coerce(None, int | None) is None
    with pytest.raises(ValueError, match="must be an integer, got None"):
        tc.coerce(None, int)
    assert tc.coerce(("a", "b"), list[str]) == ["a", "b"]
    assert tc.coerce({"a": 1}, dict) == {"a": 1}
    with pytest.raises(ValueError, match="must be a string, got 3"):
        tc.coerce(3, str)
    assert tc.type_name(int | None) == "an integer or null"
    assert tc.type_name(Literal["a", "b"]) == "'a' | 'b'"
    assert tc.type_name(list[float]) == "a list of a number"
    with pytest.raises(TypeError, match="unsupported config type"):
        tc.coerce(1, complex)


def test_set_overrides_parse_as_yaml_and_nest():
    raw = {"optim": {"lr": 1.0}, "train": 5}
    out = tc.apply_overrides(raw, ["optim.lr=3e-4", "optim.betas=[0.8, 0.9]", "train.steps=100",
                                   "model.size=70m", "eval.note=a=b", "data.path=", "x.y=[1,"])
    assert raw == {"optim": {"lr": 1.0}, "train": 5}  # the input is not modified
    assert out["optim"] == {"lr": "3e-4", "betas": [0.8, 0.9]}  # "3e-4" becomes a number in build_section
    assert out["train"] == {"steps": 100}  # a non-mapping on the path is replaced
    assert out["model"] == {"size": "70m"}
    assert out["eval"] == {"note": "a=b"}  # split at the first "="
    assert out["data"] == {"path": None}  # empty value = null
    assert out["x"] == {"y": "[1,"}  # not valid YAML: kept as written
    assert tc.parse_override(" a.b = 1") == (["a", "b"], 1)


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
