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


def _documented_check(name: str) -> tuple[str, str, int]:
    """The YAML shown for ``name``, then what the docs say `config check` prints and returns."""
    shown = re.search(
        rf"^```yaml\n((?:(?!```).)*)^```\n\nit prints:\n\n```console\n"
        rf"^\$ gpurouter config check {re.escape(name)}\n(.*?)^\$ echo \$\?\n(\d+)\n",
        DOCS.read_text(),
        flags=re.MULTILINE | re.DOTALL,
    )
    assert shown is not None, f"docs/configuration.md shows no check of {name}"
    return shown.group(1), shown.group(2), int(shown.group(3))


@pytest.mark.parametrize("name", ["custom-fleet.yaml", "broken-fleet.yaml"])
def test_the_documented_check_output_is_what_the_command_prints(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A valid file's summary and notes go to stdout; a broken file's problems to stderr."""
    text, output, code = _documented_check(name)
    (tmp_path / name).write_text(text)
    monkeypatch.chdir(tmp_path)
    assert main(["config", "check", name]) == code
    assert capsys.readouterr() == ((output, "") if code == 0 else ("", output))


def test_the_documented_check_of_the_example_fleet_is_what_the_command_prints(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The first console block: an example fleet that is valid and fully profiled."""
    shown = re.search(
        r"^```console\n\$ gpurouter config check (\S+)\n(.*?)^```",
        DOCS.read_text(),
        flags=re.MULTILINE | re.DOTALL,
    )
    assert shown is not None
    monkeypatch.chdir(ROOT)
    assert main(["config", "check", shown.group(1)]) == 0
    assert capsys.readouterr() == (shown.group(2), "")
