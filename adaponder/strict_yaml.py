"""Strict YAML reading for every configuration file and ``--set`` value.

PyYAML's ``safe_load`` lets a repeated key silently win (a repeated section replaces the first one whole),
expands aliases without bound (a few lines of ``&a [*b, *b, ...]`` stand for billions of nodes that anything
walking the tree — validation, a deep copy, DeepSpeed printing its config — then visits), and a byte that is not
UTF-8 surfaces as a ``UnicodeDecodeError``. Here a repeated key is an error naming both lines, a document whose
aliases expand to more than :data:`MAX_NODES` nodes is refused before anything walks it, and undecodable bytes
are an error naming the line and byte offset. Merge keys (``<<: *defaults``) still work: the keys written
beside a merge override the merged ones, as YAML intends.
"""

from __future__ import annotations

from typing import Any

import yaml

#: Nodes a document may expand to, aliases counted each time they are used. Real configs hold a few hundred.
MAX_NODES = 100_000


class YamlError(ValueError):
    """A YAML text that cannot be read as a configuration; the message says where (line, byte)."""


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key repeated within one mapping (merge keys excepted)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                try:
                    first = seen.get(key)
                except TypeError:  # an unhashable key: SafeLoader reports it below
                    continue
                if first is not None:
                    raise YamlError(f"line {line}: duplicate key {key!r} (first given on line {first}); "
                                    "each key may appear once per mapping")
                seen[key] = line
        return super().construct_mapping(node, deep=deep)


def _expanded_size(node: yaml.Node, memo: dict[int, int]) -> int:
    """Nodes of ``node`` with every alias expanded; each distinct node is sized once, so a bomb is sized fast."""
    key = id(node)
    if memo.get(key) == 0:
        raise YamlError(f"line {node.start_mark.line + 1}: an alias refers to a value that contains it "
                        "(a recursive structure cannot be a configuration value)")
    if key not in memo:
        memo[key] = 0  # being sized: meeting it again below is a recursion
        children: list[yaml.Node] = []
        if isinstance(node, yaml.SequenceNode):
            children = node.value
        elif isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        memo[key] = 1 + sum(_expanded_size(c, memo) for c in children)
    return memo[key]


def load_yaml(text: str) -> Any:
    """The value of one YAML document (``None`` for an empty one), read strictly (see the module doc).
    Raises :class:`YamlError` for a repeated key or too large an expansion, ``yaml.YAMLError`` for bad syntax."""
    loader = _StrictLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        size = _expanded_size(node, {})
        if size > MAX_NODES:
            raise YamlError(f"its aliases expand to {size:,} nodes, more than the {MAX_NODES:,} a configuration "
                            "may hold (an alias bomb?); write the values out or use fewer nested aliases")
        return loader.construct_document(node)
    finally:
        loader.dispose()


def decode_utf8(data: bytes) -> str:
    """``data`` as UTF-8 text; an undecodable byte is a :class:`YamlError` naming its line and byte offset."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[:err.start].count(b"\n") + 1
        raise YamlError(f"line {line} (byte {err.start}): byte 0x{data[err.start]:02x} is not valid UTF-8; "
                        "save the file as UTF-8") from None


__all__ = ["MAX_NODES", "YamlError", "decode_utf8", "load_yaml"]
