"""Typed YAML configurations shared by pretraining (``adaponder.train.config``), the study
(``adaponder.study.config``) and GLUE fine-tuning (``adaponder.palbert.config``): dataclass sections validated
by pydantic, ``--set key.path=value`` overrides, and one error that lists every problem at once, naming the
file and each offending key path (``optim.lr``).

A section is a plain dataclass whose field annotations carry the limits (``Annotated[Int, Field(ge=1)]``);
:func:`validate_sections` / :func:`build_section` validate raw YAML into it and turn pydantic's errors into
``section.key: must be >= 1, got 0`` lines. Checks across keys stay plain functions of the built config, run
after these, so their problems join the same error.

Numbers: YAML 1.1 reads ``1e-3`` and ``3e11`` as strings; :data:`Int` and :data:`Float` fields accept such
strings, and :data:`Int` fields integral floats (``tokens: 3.0e11``); booleans are not numbers.
:data:`StepsOrFraction` fields keep which one was written, so ``10`` stays a step count and ``0.1`` a fraction.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import os
import types
import typing
from pathlib import Path
from typing import Annotated, Any, Literal, Mapping, Union

import yaml
from pydantic import AfterValidator, BeforeValidator, Field, TypeAdapter, ValidationError
from pydantic_core import PydanticCustomError

from adaponder.strict_yaml import YamlError, decode_utf8, load_yaml

__all__ = ["ConfigError", "Int", "Float", "StepsOrFraction", "Count", "NonNegativeInt", "NonNegativeFloat",
           "PositiveFloat", "UnitFloat", "type_name", "coerce", "build_section", "validate_sections",
           "parse_override", "apply_overrides", "read_yaml"]


class ConfigError(ValueError):
    """Every problem of a configuration, listed at once, naming the file and key paths. The one error class of
    configurations: the training, fine-tuning and study configurations' errors and the model configuration's
    ``AdaPonderConfigError`` (where adaponder is installed; see its docstring) are its subclasses."""

    #: What the configuration configures, for the message ("the training configuration").
    what = "the configuration"

    def __init__(self, problems: list[str], source: str | None = None):
        self.problems = list(problems)
        self.source = source
        where = f" in {source}" if source else ""
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"{len(self.problems)} problem(s) in {self.what}{where}:\n{lines}")


# -- field types ------------------------------------------------------------------------------------------
def _yaml_number(value: Any) -> Any:
    if isinstance(value, bool):  # pydantic's lax mode would read true as 1
        raise PydanticCustomError("number_type", "a boolean is not a number")
    if isinstance(value, str):
        for parse in (int, float):  # int first: "10" stays a step count in StepsOrFraction
            try:
                return parse(value)
            except ValueError:
                pass
    return value


def _steps_or_fraction(value: int | float) -> int | float:
    if isinstance(value, float) and not 0.0 <= value <= 1.0:
        raise ValueError(f"a float is a fraction of training and must lie in [0, 1], got {value} "
                         "(write an integer for a step count)")
    if isinstance(value, int) and value < 0:
        raise ValueError(f"must be >= 0, got {value}")
    return value


Int = Annotated[int, BeforeValidator(_yaml_number)]
#: Finite: ``lr: .inf`` or ``--set optim.lr=nan`` would otherwise train on until the loss turns non-finite.
Float = Annotated[float, BeforeValidator(_yaml_number), Field(allow_inf_nan=False)]
#: An integer is a step count (>= 0), a float a fraction of all steps in [0, 1]; pydantic's smart union keeps
#: the type that was written (``1.0`` is all of training, not step 1).
StepsOrFraction = Annotated[Union[int, Annotated[float, Field(allow_inf_nan=False)]], BeforeValidator(_yaml_number),
                            AfterValidator(_steps_or_fraction)]
Count = Annotated[Int, Field(ge=1)]
NonNegativeInt = Annotated[Int, Field(ge=0)]
NonNegativeFloat = Annotated[Float, Field(ge=0)]
PositiveFloat = Annotated[Float, Field(gt=0)]
UnitFloat = Annotated[Float, Field(ge=0, le=1)]


def type_name(tp: Any) -> str:
    """How a field's type reads in an error message ("an integer or null", "'cosine' | 'linear')."""
    origin = typing.get_origin(tp)
    if origin is Annotated:
        return type_name(typing.get_args(tp)[0])
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        name = " or ".join(type_name(a) for a in args if a is not type(None))
        return name + (" or null" if type(None) in args else "")
    if origin is list:
        args = typing.get_args(tp)
        return f"a list of {type_name(args[0])}" if args else "a list"
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string", dict: "a mapping",
            list: "a list"}.get(tp, getattr(tp, "__name__", str(tp)))


# -- validation -------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _adapter(tp: Any) -> TypeAdapter:
    return TypeAdapter(tp)


_LIMITS = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}


def _message(errors: list[dict[str, Any]], value: Any, tp: Any) -> str:
    """One line for a value's pydantic errors: a broken limit, or a validator's own words, else the type."""
    for e in errors:
        kind, ctx = e["type"], e.get("ctx") or {}
        if kind in _LIMITS:
            return f"must be {_LIMITS[kind]} {next(iter(ctx.values()))}, got {e['input']!r}"
        if kind in ("too_short", "too_long"):
            bound = f"at least {ctx['min_length']}" if kind == "too_short" else f"at most {ctx['max_length']}"
            return f"must hold {bound} item(s), got {e['input']!r}"
        if kind == "value_error":
            return str(ctx["error"])
        if kind == "finite_number":  # an integer field says which type it wanted
            what = type_name(tp).replace("a number", "a finite number")
            return f"must be {what}, got {e['input']!r}"

    if isinstance(value, str) and value.strip()[:1] in ("[", "{"):  # meant as a list or mapping (--set keeps a
        try:  # value that is not valid YAML as written): its syntax is the problem, not its type
            yaml.safe_load(value)
        except yaml.YAMLError as err:
            what = "a list" if value.strip()[0] == "[" else "a mapping"
            reason = " ".join(str(getattr(err, "problem", None) or err).split())
            return (f"{value.strip()!r} does not parse as {what} ({reason}); expected YAML flow syntax, e.g. "
                    f"{'[0.9, 0.95]' if what == 'a list' else '{a: 1}'}")
    return f"must be {type_name(tp)}, got {value!r}"


def coerce(value: Any, tp: Any) -> Any:
    """``value`` validated as type ``tp`` (pydantic); raises ``ValueError`` saying what was expected."""
    try:
        return _adapter(tp).validate_python(value)
    except ValidationError as err:
        raise ValueError(_message(err.errors(), value, tp)) from None


def _unknown(key: Any, known: list[str]) -> str:
    near = [k for k in known if k.startswith(str(key)[:3])] or difflib.get_close_matches(str(key), known, cutoff=0.75)
    return f" (did you mean {', '.join(near)}?)" if near else f" (known: {', '.join(known)})"


def build_section(cls: type, raw: Any, name: str, problems: list[str], bad: set[str] | None = None) -> Any:
    """An instance of the dataclass ``cls`` validated from a raw mapping. Unknown keys and bad values are
    appended to ``problems`` as ``name.key: ...`` (and the key paths of bad values to ``bad``, so checks
    across keys can skip them); the offending keys keep their defaults."""
    bad = set() if bad is None else bad
    fields = [f.name for f in dataclasses.fields(cls)]
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        problems.append(f"{name}: must be a mapping of {', '.join(fields)}, got {type(raw).__name__}")
        bad.add(name)
        return cls()
    values = {k: v for k, v in raw.items() if k in fields}
    errors: dict[str, list[dict[str, Any]]] = {}
    try:
        section = _adapter(cls).validate_python(values)
    except ValidationError as err:
        for e in err.errors():
            errors.setdefault(e["loc"][0], []).append(e)
        section = _adapter(cls).validate_python({k: v for k, v in values.items() if k not in errors})
    hints = typing.get_type_hints(cls)
    for key, value in raw.items():  # in the file's order
        if key not in fields:
            problems.append(f"{name}.{key}: unknown key{_unknown(key, fields)}")
        elif key in errors:
            problems.append(f"{name}.{key}: {_message(errors[key], value, hints[key])}")
            bad.add(f"{name}.{key}")
    return section


def validate_sections(raw: Mapping[str, Any], sections: Mapping[str, type], problems: list[str],
                      bad: set[str] | None = None, others: tuple[str, ...] = ()) -> dict[str, Any]:
    """Every section of a raw (YAML) mapping built by :func:`build_section` (name → instance); top-level keys
    that are neither a section nor one of ``others`` (validated by the caller) are reported as unknown."""
    known = [*sections, *others]
    problems += [f"{key}: unknown section{_unknown(key, known)}" for key in raw if key not in known]
    return {name: build_section(cls, raw.get(name), name, problems, bad) for name, cls in sections.items()}


# -- files and overrides ----------------------------------------------------------------------------------
def parse_override(item: str, error: type[ConfigError] = ConfigError) -> tuple[list[str], Any]:
    """``"optim.lr=3e-4"`` → ``(["optim", "lr"], "3e-4")``; the value is parsed as YAML (1.1: the number
    string becomes a number when its field validates)."""
    if "=" not in item:
        raise error([f"--set {item!r}: expected key.path=value"])
    key, raw = item.split("=", 1)
    path = [k for k in key.strip().split(".") if k]
    if not path:
        raise error([f"--set {item!r}: empty key"])
    try:
        value = load_yaml(raw) if raw.strip() else None
    except YamlError as err:
        raise error([f"--set {item!r}: {err}"]) from None
    except yaml.YAMLError:
        value = raw
    return path, value


def apply_overrides(raw: Mapping[str, Any], overrides: list[str] | None,
                    error: type[ConfigError] = ConfigError) -> dict[str, Any]:
    """``["optim.lr=3e-4", "train.steps=100"]`` applied to a copy of a raw (YAML) mapping."""
    raw = copy.deepcopy(dict(raw))
    for item in overrides or []:
        path, value = parse_override(item, error)
        node = raw
        for k in path[:-1]:
            if not isinstance(node.get(k), dict):
                node[k] = {}
            node = node[k]
        node[path[-1]] = value
    return raw


def read_yaml(path: str | os.PathLike[str], error: type[ConfigError] = ConfigError) -> dict[str, Any]:
    """The mapping a YAML config file holds (empty file: ``{}``); a missing file, invalid YAML or a
    non-mapping top level raise ``error`` naming the file, as do the strict reader's refusals
    (:mod:`adaponder.strict_yaml`: a repeated key, bytes that are not UTF-8, an alias bomb)."""
    p = Path(path)
    if not p.is_file():
        raise error([f"config file {p} does not exist"], str(p))
    try:
        raw = load_yaml(decode_utf8(p.read_bytes())) or {}
    except YamlError as err:
        raise error([f"{p}: {err}"], str(p)) from None
    except yaml.YAMLError as err:
        raise error([f"not valid YAML: {err}"], str(p)) from None
    if not isinstance(raw, dict):
        raise error([f"the file must hold a mapping of sections, got {type(raw).__name__}"], str(p))
    return raw
