"""YAML that remembers lines, so that every problem in a file can name its line.

The fleet loader and the performance profiles read their files through here. Mappings come
back as :class:`LineMap` and lists as :class:`LineList`, plain ``dict`` and ``list``
subclasses that also carry the line each key and item is on; scalars are what PyYAML's safe
loader makes of them. Any failure (unreadable file, not UTF-8, not YAML) is a
:class:`~router.errors.ConfigError` with one :class:`~router.errors.Problem` naming the file,
and the line where YAML says it has one.
"""

from __future__ import annotations

from collections.abc import Hashable
from pathlib import Path
from typing import Any, NamedTuple

import yaml

try:  # libyaml parses several times faster and marks lines the same way
    from yaml import CSafeLoader as _SafeLoader
except ImportError:  # PyYAML built without libyaml
    from yaml import SafeLoader as _SafeLoader  # type: ignore[assignment]  # same interface

from router.errors import ConfigError, Problem

__all__ = ["FILE_KEY", "Duplicate", "LineList", "LineMap", "parse_yaml", "read_yaml"]

FILE_KEY = "<file>"
"""The key a problem names when it is about the file as a whole."""


class Duplicate(NamedTuple):
    """A key written twice in one mapping; the mapping keeps the later value."""

    key: Any
    line: int
    """Line of the repeat (the one whose value was kept)."""
    first_line: int
    """Line where the key was written before."""


class LineMap(dict[Any, Any]):
    """A YAML mapping with the line it starts on and the line of each key (1-based)."""

    def __init__(self, line: int) -> None:
        super().__init__()
        self.line = line
        self.key_lines: dict[Any, int] = {}
        """Each key's line; for a key written twice, the line of the value kept."""
        self.duplicates: list[Duplicate] = []
        """Keys written twice in this mapping (merged-in keys that it overrides do not count)."""


class LineList(list[Any]):
    """A YAML list with the line it starts on and the line of each item (1-based)."""

    def __init__(self, line: int) -> None:
        super().__init__()
        self.line = line
        self.item_lines: list[int] = []


class _LineLoader(_SafeLoader):
    """The safe loader (no arbitrary objects built from a file) with line-keeping containers."""


def _line(node: yaml.Node) -> int:
    return node.start_mark.line + 1


def _construct_map(loader: yaml.SafeLoader, node: yaml.Node) -> LineMap:
    assert isinstance(node, yaml.MappingNode)
    own = {id(key) for key, _ in node.value}
    loader.flatten_mapping(node)  # resolves `<<: *anchor`; merged keys come first
    result, written = LineMap(_line(node)), set[Any]()
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, Hashable):
            raise yaml.constructor.ConstructorError(
                None, None, "a key cannot be a list or a mapping", key_node.start_mark
            )
        # PyYAML lets a repeated key silently win; only keys written here count, since
        # overriding a merged-in key is what merges are for.
        if id(key_node) in own:
            if key in written:
                result.duplicates.append(Duplicate(key, _line(key_node), result.key_lines[key]))
            written.add(key)
        result[key] = loader.construct_object(value_node, deep=True)
        result.key_lines[key] = _line(key_node)
    return result


def _construct_seq(loader: yaml.SafeLoader, node: yaml.Node) -> LineList:
    assert isinstance(node, yaml.SequenceNode)
    result = LineList(_line(node))
    for item in node.value:
        result.append(loader.construct_object(item, deep=True))
        result.item_lines.append(_line(item))
    return result


_LineLoader.add_constructor("tag:yaml.org,2002:map", _construct_map)
_LineLoader.add_constructor("tag:yaml.org,2002:seq", _construct_seq)


def parse_yaml(text: str, source: str) -> Any:
    """The one YAML document in ``text``; ``source`` names it in the ConfigError otherwise."""
    loader = _LineLoader(text)
    try:
        return loader.get_single_data()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        what = ": ".join(part for part in (exc.context, exc.problem) if part)
        line = mark.line + 1 if mark else None
        column = f" (column {mark.column + 1})" if mark else ""
        problem = Problem(source, line, FILE_KEY, f"not valid YAML: {what}{column}")
    except yaml.reader.ReaderError as exc:
        line = text.count("\n", 0, exc.position) + 1
        what = f"{exc.reason} (character #x{exc.character:04x})"
        problem = Problem(source, line, FILE_KEY, f"not valid YAML: {what}")
    except yaml.YAMLError as exc:  # any other kind carries no position
        problem = Problem(source, None, FILE_KEY, f"not valid YAML: {exc}")
    finally:
        loader.dispose()
    raise ConfigError([problem])


def read_yaml(path: str | Path) -> Any:
    """The one YAML document in the file at ``path``; a ConfigError naming it otherwise."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise ConfigError([Problem(source, None, FILE_KEY, f"cannot read: {reason}")]) from None
    except UnicodeDecodeError as exc:
        problem = Problem(source, None, FILE_KEY, f"not UTF-8 text: {exc.reason}")
        raise ConfigError([problem]) from None
    return parse_yaml(text, source)
