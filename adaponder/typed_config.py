"""Typed YAML configurations shared by pretraining (``adaponder.train.config``) and GLUE fine-tuning
(``adaponder.palbert.config``): dataclass sections, ``--set key.path=value`` overrides, and one error that
lists every problem at once, naming the file and each offending key path (``optim.lr``).

Numbers: YAML 1.1 reads ``1e-3`` as a string; number fields accept such strings. Integer fields accept
integral floats (``tokens: 3.0e11``). ``int | float`` fields ("steps or fractions") keep which one was
written, so ``10`` stays a step count and ``0.1`` a fraction.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import types
import typing
from pathlib import Path
from typing import Any, Literal, Mapping, Union

import yaml

__all__ = ["ConfigError", "type_name", "coerce", "build_section", "parse_override", "apply_overrides", "read_yaml"]


class ConfigError(ValueError):
    """Every problem of a configuration, listed at once, naming the file and key paths.

    The model configuration's ``AdaPonderConfigError`` has the same interface but stays a separate class
    (see its docstring): catch both, or ``ValueError``."""

    #: What the configuration configures, for the message ("the training configuration").
    what = "the configuration"

    def __init__(self, problems: list[str], source: str | None = None):
        self.problems = list(problems)
        self.source = source
        where = f" in {source}" if source else ""
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"{len(self.problems)} problem(s) in {self.what}{where}:\n{lines}")


def type_name(tp: Any) -> str:
    """How a field's type reads in an error message ("an integer or null", "'cosine' | 'linear')."""
    origin = typing.get_origin(tp)
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


class _Bad(Exception):
    pass


def _number(value: Any, integral: bool) -> int | float:
    if isinstance(value, bool):
        raise _Bad
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise _Bad from None
    if not isinstance(value, (int, float)):
        raise _Bad
    if not integral:
        return float(value)
    if isinstance(value, int):
        return value
    if math.isfinite(value) and value == int(value):
        return int(value)
    raise _Bad


def coerce(value: Any, tp: Any) -> Any:
    """``value`` as type ``tp`` (a dataclass field's resolved annotation); raises ``ValueError`` if it is not."""
    try:
        return _coerce(value, tp)
    except _Bad:
        raise ValueError(f"must be {type_name(tp)}, got {value!r}") from None


def _coerce(value: Any, tp: Any) -> Any:
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None:
            if type(None) in args:
                return None
            raise _Bad
        non_none = [a for a in args if a is not type(None)]
        if set(non_none) == {int, float}:  # steps (int) or fraction (float): keep which one was written
            if isinstance(value, bool) or not isinstance(value, (int, float, str)):
                raise _Bad
            if isinstance(value, str):
                try:
                    return int(value)
                except ValueError:
                    return _number(value, integral=False)
            return value
        for a in non_none:
            try:
                return _coerce(value, a)
            except _Bad:
                pass
        raise _Bad
    if origin is Literal:
        if value in typing.get_args(tp):
            return value
        raise _Bad
    if origin is list or tp is list:
        if isinstance(value, tuple):
            value = list(value)
        if not isinstance(value, list):
            raise _Bad
        args = typing.get_args(tp)
        return [_coerce(v, args[0]) for v in value] if args else value
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise _Bad
    if tp in (int, float):
        return _number(value, integral=tp is int)
    if tp is str:
        if isinstance(value, str):
            return value
        raise _Bad
    if tp is dict:
        if isinstance(value, Mapping):
            return dict(value)
        raise _Bad
    if tp is Any:
        return value
    raise TypeError(f"unsupported config type {tp!r}")


def build_section(cls: type, raw: Any, name: str, problems: list[str], bad: set[str] | None = None) -> Any:
    """An instance of the dataclass ``cls`` from a raw mapping. Unknown keys and wrong types are appended to
    ``problems`` as ``name.key: ...`` (and the key paths to ``bad``, so value checks can skip them); the
    offending keys keep their defaults."""
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        problems.append(f"{name}: must be a mapping of {', '.join(f.name for f in dataclasses.fields(cls))}, "
                        f"got {type(raw).__name__}")
        if bad is not None:
            bad.add(name)
        return cls()
    hints = typing.get_type_hints(cls)
    fields = [f.name for f in dataclasses.fields(cls)]
    values = {}
    for key, value in raw.items():
        if key not in fields:
            near = [f for f in fields if f.startswith(str(key)[:3])]
            hint = f" (did you mean {', '.join(near)}?)" if near else f" (known: {', '.join(fields)})"
            problems.append(f"{name}.{key}: unknown key{hint}")
            continue
        try:
            values[key] = coerce(value, hints[key])
        except ValueError as err:
            problems.append(f"{name}.{key}: {err}")
            if bad is not None:
                bad.add(f"{name}.{key}")
    return cls(**values)


def parse_override(item: str, error: type[ConfigError] = ConfigError) -> tuple[list[str], Any]:
    """``"optim.lr=3e-4"`` → ``(["optim", "lr"], 0.0003)``; the value is parsed as YAML."""
    if "=" not in item:
        raise error([f"--set {item!r}: expected key.path=value"])
    key, raw = item.split("=", 1)
    path = [k for k in key.strip().split(".") if k]
    if not path:
        raise error([f"--set {item!r}: empty key"])
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
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
    non-mapping top level raise ``error`` naming the file."""
    p = Path(path)
    if not p.is_file():
        raise error([f"config file {p} does not exist"], str(p))
    try:
        raw = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as err:
        raise error([f"not valid YAML: {err}"], str(p)) from None
    if not isinstance(raw, dict):
        raise error([f"the file must hold a mapping of sections, got {type(raw).__name__}"], str(p))
    return raw
