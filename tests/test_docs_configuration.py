"""docs/configuration.md documents every configuration field, in the words of its docstring."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from console.cli import main
from router.config import parse_fleet
from router.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = ROOT / "router" / "config" / "schema.py"
DOCS = ROOT / "docs" / "configuration.md"


def _plain(text: str) -> str:
    """Docstring text as markdown shows it: one line, ``rst`` literals as `markdown`."""
    return " ".join(text.replace("``", "`").split())


def _is_dataclass(node: ast.ClassDef) -> bool:
    for decorator in node.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        if isinstance(target, ast.Name) and target.id == "dataclass":
            return True
    return False


def _schema() -> dict[str, tuple[str, dict[str, str]]]:
    """Class name -> (class docstring, field name -> field docstring), read from the source."""
    classes: dict[str, tuple[str, dict[str, str]]] = {}
    for node in ast.parse(SCHEMA.read_text()).body:
        if not (isinstance(node, ast.ClassDef) and _is_dataclass(node)):
            continue
        fields: dict[str, str] = {}
        for statement, after in zip(node.body, [*node.body[1:], None], strict=True):
            if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
                doc = ""
                if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant):
                    doc = str(after.value.value)
                fields[statement.target.id] = _plain(doc)
        classes[node.name] = (_plain(ast.get_docstring(node) or ""), fields)
    return classes


def _sections() -> dict[str, str]:
    """Dataclass name -> the text of the reference section whose heading names it."""
    sections: dict[str, str] = {}
    for part in re.split(r"^### ", DOCS.read_text(), flags=re.MULTILINE)[1:]:
        heading = part.splitlines()[0]
        for name in re.findall(r"`(\w+Config)`", heading):
            sections[name] = part
    return sections


SCHEMA_CLASSES = _schema()


def test_the_schema_is_found() -> None:
    """Guards the other tests against passing vacuously on a parse that found nothing."""
    assert {"FleetConfig", "ReplicaConfig", "BrokerConfig"} <= set(SCHEMA_CLASSES)
    assert "weight" in SCHEMA_CLASSES["ReplicaConfig"][1]


@pytest.mark.parametrize("name", sorted(SCHEMA_CLASSES))
def test_every_dataclass_has_a_reference_section(name: str) -> None:
    class_doc, _ = SCHEMA_CLASSES[name]
    section = _sections().get(name)
    assert section is not None, f"docs/configuration.md has no '### ... `{name}`' section"
    assert class_doc in _plain(section)


@pytest.mark.parametrize(
    ("name", "field"),
    [(name, field) for name, (_, fields) in sorted(SCHEMA_CLASSES.items()) for field in fields],
)
def test_every_field_has_a_row_with_its_docstring(name: str, field: str) -> None:
    section = _sections()[name]
    rows = [line for line in section.splitlines() if line.startswith(f"| `{field}` |")]
    assert len(rows) == 1, f"{name}.{field}: expected one table row in its section"
    assert SCHEMA_CLASSES[name][1][field] in rows[0], f"{name}.{field}: docstring differs"


def _yaml_blocks() -> list[str]:
    return re.findall(r"^```yaml\n(.*?)^```", DOCS.read_text(), flags=re.MULTILINE | re.DOTALL)


def test_the_documented_examples_load() -> None:
    """Every YAML example in the reference is a valid fleet, except the one shown broken."""
    *good, broken = _yaml_blocks()
    assert good
    for text in good:
        assert parse_fleet(text, "docs").nodes
    with pytest.raises(ConfigError):
        parse_fleet(broken, "docs")


def test_the_documented_check_output_is_what_the_command_prints(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    shown = re.search(
        r"^\$ gpurouter config check broken-fleet.yaml\n(.*?)^\$ echo",
        DOCS.read_text(),
        flags=re.MULTILINE | re.DOTALL,
    )
    assert shown is not None
    (tmp_path / "broken-fleet.yaml").write_text(_yaml_blocks()[-1])
    monkeypatch.chdir(tmp_path)
    assert main(["config", "check", "broken-fleet.yaml"]) == 2
    assert capsys.readouterr().err == shown.group(1)
