"""Reading the profile YAML files so that every problem can name its file, line and key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from router.errors import ConfigError, Problem

FILE_KEY = "<file>"
"""The key a problem names when it is about the file as a whole."""


class LineMap(dict[Any, Any]):
    """A YAML mapping that remembers the line (1-based) it starts on and each key's line."""

    def __init__(self, line: int) -> None:
        super().__init__()
        self.line = line
        self.key_lines: dict[Any, int] = {}
        self.duplicates: list[tuple[Any, int]] = []


class _LineLoader(yaml.SafeLoader):
    """SafeLoader whose mappings are :class:`LineMap`."""


def _construct_map(loader: yaml.SafeLoader, node: yaml.Node) -> LineMap:
    assert isinstance(node, yaml.MappingNode)
    result = LineMap(node.start_mark.line + 1)
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, str | int | float | bool) and key is not None:
            raise yaml.constructor.ConstructorError(
                None, None, "a key must be a plain name", key_node.start_mark
            )
        line = key_node.start_mark.line + 1
        if key in result.key_lines:
            result.duplicates.append((key, line))
        result[key] = loader.construct_object(value_node, deep=True)
        result.key_lines[key] = line
    return result


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_map)


def read_yaml(path: Path) -> Any:
    """Parse ``path``; an unreadable or malformed file is a ConfigError naming the line."""
    source = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError([Problem(source, None, FILE_KEY, f"cannot read: {exc}")]) from exc
    try:
        # _LineLoader is a SafeLoader: no arbitrary objects are built from the file.
        return yaml.load(text, Loader=_LineLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        message = f"not valid YAML: {exc.problem or exc.context}"
        raise ConfigError([Problem(source, line, FILE_KEY, message)]) from exc
    except yaml.YAMLError as exc:
        raise ConfigError([Problem(source, None, FILE_KEY, f"not valid YAML: {exc}")]) from exc
