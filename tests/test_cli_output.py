"""The CLI's two contracts in one place each: exit codes (distinct, documented) and output
(one JSON document with --json, aligned plain text when piped, nothing ad hoc in commands)."""

from __future__ import annotations

import ast
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from click.testing import CliRunner

from outbox.app.cli import exit_codes, main, output
from tests.workspaces import dispatched_workspace

CLI = Path(output.__file__).parent


def test_exit_codes_are_distinct_and_documented() -> None:
    codes = exit_codes.ALL
    assert len(set(codes.values())) == len(codes)
    assert (codes["OK"], codes["ERROR"], codes["USAGE"], codes["INTERRUPTED"]) == (0, 1, 2, 130)
    doc = exit_codes.__doc__ or ""
    for name, code in codes.items():
        assert f"\n{code:<7}{name} " in doc, f"{name} = {code} is missing from the docstring table"


def test_aligned_columns() -> None:
    assert output.aligned(["field", "value"], [["pending documents", "2"], ["table", "t"]]) == [
        "field              value",
        "pending documents  2",
        "table              t",
    ]
    assert output.aligned(["a", "b", "c"], [["x", "", ""]]) == ["a  b  c", "x"]


def test_piped_output_is_plain_text_and_json_is_one_document(
    capsys: pytest.CaptureFixture[str],
) -> None:
    output.print_kv("title", [("long field name", 1), ("f", None)])
    assert capsys.readouterr().out.splitlines() == [
        "# title",
        "field            value",
        "long field name  1",
        "f",
    ]
    output.emit_json({"at": datetime(2024, 1, 2, tzinfo=UTC), "body": b"x", "path": Path("/p")})
    assert json.loads(capsys.readouterr().out) == {
        "at": "2024-01-02T00:00:00+00:00",
        "body": "x",
        "path": "/p",
    }
    output.emit_json_line({"b": 1, "a": [2]})
    assert capsys.readouterr().out == '{"a": [2], "b": 1}\n'


def test_commands_write_only_through_the_output_module() -> None:
    """No command module prints or dumps JSON on its own: the output contract lives in one
    place (outbox/app/cli/output.py)."""
    offenders = []
    for path in sorted(CLI.glob("*.py")):
        if path.name == "output.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            name = (
                f"{f.value.id}.{f.attr}"
                if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name)
                else f.id
                if isinstance(f, ast.Name)
                else ""
            )
            if name in {"print", "click.echo", "click.secho", "json.dumps", "sys.stdout.write"}:
                offenders.append(f"{path.name}:{node.lineno} {name}")
    assert offenders == []


def test_usage_errors_keep_clicks_code() -> None:
    result = CliRunner().invoke(main, ["queue", "peek", "q", "--limit", "0"])
    assert result.exit_code == exit_codes.USAGE


def test_help_imports_nothing_heavy() -> None:
    """``outbox --help`` stays fast: command modules import Delta, SQL and rich lazily."""
    import subprocess
    import sys

    heavy = (
        "sqlalchemy",
        "deltalake",
        "pyarrow",
        "rich",
        "alembic",
        "pyspark",
        "outbox.app.facade",
    )
    code = f"import sys, outbox.app.cli; print([m for m in {heavy!r} if m in sys.modules])"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


def test_readme_exit_code_table_matches_the_module() -> None:
    """One table in docs/operations.md, the same codes as ``exit_codes.ALL``: adding a code
    means documenting it where operators look."""
    readme = (Path(__file__).resolve().parents[1] / "docs" / "operations.md").read_text()
    tables = [t for t in readme.split("\n\n") if t.startswith("| exit code | meaning |")]
    assert len(tables) == 1
    rows = tables[0].splitlines()[2:]
    assert sorted(int(r.split("|")[1]) for r in rows) == sorted(exit_codes.ALL.values())
    assert exit_codes.ERROR == 1
    assert "run-dispatcher --once" in rows[1]


def test_text_names_a_duration_as_json_does(tmp_path: Path) -> None:
    """``maintain`` piped showed ``vacuum_retention_hours`` where ``--json`` says
    ``vacuum_retention_s``: a field of a record reads the same in text and JSON."""
    ws = dispatched_workspace(tmp_path / "ws")
    result = CliRunner().invoke(main, ["-w", str(ws), "maintain", "--vacuum", "2h"])
    assert result.exit_code == 0, result.output
    fields = dict(line.split(None, 1) for line in result.stdout.splitlines()[2:] if " " in line)
    assert fields["vacuum_retention_s"] == "7200"
    assert "duration_s" in fields
    assert [f for f in fields if f == "seconds" or f.endswith(("_seconds", "_hours"))] == []


def test_readme_json_shapes_name_the_keys_the_commands_print(tmp_path: Path) -> None:
    """The ``--json`` table (README then, docs/operations.md now) named
    ``oldest_pending_age_seconds``; the key is ``oldest_pending_age_s``. Every key it names for
    ``status`` is one ``status --json`` has."""
    import re

    readme = (Path(__file__).resolve().parents[1] / "docs" / "operations.md").read_text()
    [row] = [ln for ln in readme.splitlines() if ln.startswith("| `status` | an object:")]
    named = re.findall(r"`([a-z_]+)`", row.split("|")[2])
    ws = dispatched_workspace(tmp_path / "ws")
    result = CliRunner().invoke(main, ["-w", str(ws), "status", "--json"])
    assert result.exit_code == 0, result.output
    printed = json.loads(result.stdout)
    assert len(named) >= 6
    assert [k for k in named if k not in printed] == []
