"""A run directory is read by DuckDB as is (examples/sql), with the numbers svt computes."""

from pathlib import Path

import polars as pl
import pytest

from svt.report.summary import acceptance_by_position

duckdb = pytest.importorskip("duckdb")
ROOT = Path(__file__).resolve().parents[2]


def test_duckdb_reads_a_run_without_conversion(small_run):
    sql = (ROOT / "examples/sql/acceptance_by_position.sql").read_text().replace("runs/demo", str(small_run))
    rel = duckdb.sql(sql)
    got = pl.DataFrame(rel.fetchall(), schema=rel.columns, orient="row")
    want = acceptance_by_position(small_run)
    assert got["position"].to_list() == want["position"].to_list()
    for col in ("proposed", "verified", "accepted"):
        assert got[col].cast(pl.Int64).to_list() == want[col].cast(pl.Int64).to_list(), col
    for col in ("conditional", "marginal"):
        assert got[col].to_list() == pytest.approx(want[col].to_list(), abs=1e-12), col
