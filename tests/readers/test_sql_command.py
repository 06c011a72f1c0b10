"""``outbox sql``: the query of the current documents for other engines, the same text the
library runs; polars runs what it prints against the table's model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from outbox.app.cli import main
from outbox.delta import current
from testkit.table_states import TableStates
from tests.readers import checks


def _sql(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_it_prints_the_rule_over_the_tables_location(states: TableStates) -> None:
    ws = str(states.ob.settings.workspace)
    code, out, _ = _sql("-w", ws, "sql")
    assert code == 0
    assert out == current.current_sql(f"delta.`{states.uri}`") + "\n"
    assert _sql("-w", ws, "sql", "--dialect", "databricks")[1] == out
    duck = _sql("-w", ws, "sql", "--dialect", "duckdb")[1]
    assert f"FROM delta_scan('{states.uri}')) AS _v" in duck
    named = _sql("-w", ws, "sql", "--source", "main.outbox.documents")[1]
    assert named == current.current_sql("main.outbox.documents") + "\n"


def test_polars_runs_what_it_prints(states: TableStates) -> None:
    import polars as pl

    code, out, _ = _sql(
        "-w", str(states.ob.settings.workspace), "sql", "--dialect", "polars", "--json"
    )
    assert code == 0
    printed = json.loads(out)
    assert (printed["dialect"], printed["source"], printed["has_deleted"]) == (
        "polars",
        "documents",
        True,
    )
    frame = pl.SQLContext(documents=pl.scan_delta(states.uri)).execute(printed["sql"], eager=True)
    assert checks.as_model(frame.sort("id").to_arrow()) == states.documents(max(states.at))


def test_a_table_without_the_deleted_column_gets_the_query_without_it(tmp_path: Path) -> None:
    """Schema version 2 (no tombstones): the query does not name the column it lacks."""
    import deltalake
    import pyarrow as pa

    from outbox.delta import schema as S

    uri = str(tmp_path / "ws" / "documents")
    v2 = pa.schema([f for f in S.DOCUMENT_SCHEMA if f.name != "deleted"])
    deltalake.DeltaTable.create(uri, schema=v2, partition_by=["bucket"])
    code, out, _ = _sql("-w", str(tmp_path / "ws"), "sql")
    assert code == 0
    assert "deleted" not in out
    assert out == current.current_sql(f"delta.`{uri}`", has_deleted=False) + "\n"


@pytest.mark.parametrize(
    ("args", "code", "line"),
    [
        (
            ["sql"],
            1,
            "error: no Delta table at {ws}/documents (fix: run `outbox migrate` to create it)",
        ),
        (["sql", "--source", ""], 2, "an empty path names no file or folder"),
        (["sql", "--dialect", "oracle"], 2, "'oracle' is not one of"),
    ],
)
def test_bad_input_is_one_line(tmp_path: Path, args: list[str], code: int, line: str) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    got, out, err = _sql("-w", str(ws), *args)
    assert got == code
    assert out == ""
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert any(line.format(ws=ws) in ln for ln in lines), err
    assert "Traceback" not in err
    if code == 1:
        assert lines == [line.format(ws=ws)]
