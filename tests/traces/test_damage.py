"""Damaged or mismatched runs: every damage is one clear error, never a traceback, never a silently
different number (property tests with random damage, plus the named cases)."""

import json
import shutil

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from svt.errors import SchemaError, SvtError
from svt.traces import open_run

from ..conftest import reseal


@pytest.fixture(scope="module")
def sealed(small_run, tmp_path_factory):
    return small_run


def _copy(src, tmp_path_factory):
    dst = tmp_path_factory.mktemp("dmg") / "r"
    shutil.copytree(src, dst)
    return dst


def _content(path):
    run = open_run(path)
    return {t: run.scan(t).collect() for t in ("drafts", "steps", "requests")}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(table=st.sampled_from(["drafts", "steps", "requests", "hidden", "dists"]),
       kind=st.sampled_from(["flip", "truncate", "delete", "duplicate", "empty", "append"]),
       where=st.floats(0, 1), byte=st.integers(1, 255))
def test_random_damage_is_an_error_never_a_silent_number(sealed, tmp_path_factory, table, kind, where, byte):
    run = _copy(sealed, tmp_path_factory)
    shard = sorted((run / table).glob("part-*.parquet"))[0]
    data = bytearray(shard.read_bytes())
    if kind == "flip":
        i = int(where * (len(data) - 1))
        data[i] ^= byte
        shard.write_bytes(bytes(data))
    elif kind == "truncate":
        shard.write_bytes(bytes(data[: int(where * len(data))]))
    elif kind == "delete":
        shard.unlink()
    elif kind == "duplicate":
        shutil.copy(shard, shard.with_name("part-00099.parquet"))
    elif kind == "empty":
        pl.read_parquet(shard).head(0).write_parquet(shard)
    elif kind == "append":
        d = pl.read_parquet(shard)
        pl.concat([d, d.head(1)]).write_parquet(shard)
    try:
        got = _content(run)
    except SvtError:
        return  # one clear error: fine
    # whatever was read must be exactly the undamaged content
    want = _content(sealed)
    for t in want:
        assert got[t].equals(want[t]), f"{kind} on {table} gave different {t} rows silently"


def test_named_damage_cases(sealed, tmp_path_factory):
    run = _copy(sealed, tmp_path_factory)
    (run / "drafts" / "part-00000.parquet").unlink()
    with pytest.raises(SchemaError, match="no shards|missing"):
        open_run(run)
    run = _copy(sealed, tmp_path_factory)
    shutil.copy(run / "steps" / "part-00000.parquet", run / "steps" / "part-00000 (copy).parquet")
    with pytest.raises(SchemaError, match="not a shard"):
        open_run(run)
    run = _copy(sealed, tmp_path_factory)
    meta = json.loads((run / "run.json").read_text())
    meta["k"] = 2  # the drafts reach position 3
    (run / "run.json").write_text(json.dumps(meta))
    with pytest.raises(SchemaError, match="config says"):
        open_run(run)
    meta["config"]["k"] = 2
    (run / "run.json").write_text(json.dumps(meta))
    with pytest.raises(SchemaError, match="K = 2"):
        open_run(run)
    meta["k"] = meta["config"]["k"] = 5  # more than the drafts hold
    (run / "run.json").write_text(json.dumps(meta))
    with pytest.raises(SchemaError, match="stop at position 3"):
        open_run(run)
    meta["k"] = meta["config"]["k"] = 4
    meta["shards"] = "x"
    (run / "run.json").write_text(json.dumps(meta))
    with pytest.raises(SchemaError, match="`shards` is .x.: expected a mapping"):
        open_run(run)


def test_foreign_runs_without_records_still_read(sealed, tmp_path_factory):
    """Traces written by another engine (no shard records) are read and value-checked as before."""
    run = _copy(sealed, tmp_path_factory)
    meta = json.loads((run / "run.json").read_text())
    meta.pop("shards")
    (run / "run.json").write_text(json.dumps(meta))
    assert _content(run)["drafts"].equals(_content(sealed)["drafts"])
    from svt.report.summary import run_summary

    assert run_summary(run)["shards"].startswith("NOT verified")  # said, not silent
    assert run_summary(sealed)["shards"] == "verified against run.json"
    reseal(run)
    assert open_run(run).meta["shards"]["drafts"]


@pytest.mark.parametrize("which", [0, -1])
def test_changed_shard_with_valid_values_is_refused(sealed, tmp_path_factory, which):
    """The shards' SHA-256 are checked while their values are (on a second thread): a shard rewritten
    with valid values (its rows reordered), first or last, is still refused, and only when read deeply."""
    run = _copy(sealed, tmp_path_factory)
    shard = sorted((run / "drafts").glob("part-*.parquet"))[which]
    d = pl.read_parquet(shard)
    d.reverse().write_parquet(shard)
    with pytest.raises(SchemaError, match=f"{shard.name}: its content differs .*SHA-256"):
        open_run(run)
    assert open_run(run, deep=False).shards["drafts"]  # a shallow open does not hash


def test_undecodable_values_of_a_changed_shard_are_refused_as_changed(sealed, tmp_path_factory):
    """A flipped byte that polars cannot decode while the values are checked (found by the random
    damage test): the shard's SHA-256 says it changed, one clear error, not polars' own."""
    run = _copy(sealed, tmp_path_factory)
    shard = sorted((run / "steps").glob("part-*.parquet"))[0]
    data = bytearray(shard.read_bytes())
    data[int(0.25 * (len(data) - 1))] ^= 1
    shard.write_bytes(bytes(data))
    with pytest.raises(SchemaError, match="SHA-256"):
        open_run(run)


def test_a_panic_reading_a_changed_shard_is_refused_as_changed(sealed, tmp_path_factory, monkeypatch):
    """polars panics on some damaged bytes (seen in CI: "invalid num_bits"), and its PanicException is
    no Exception: a changed shard is still refused by its SHA-256, one clear error."""
    import svt.traces.io as io

    class Panic(BaseException):  # what pyo3 raises for a panic in polars
        pass

    def panics(*args, **kwargs):
        raise Panic("internal error: entered unreachable code: invalid num_bits 146")

    run = _copy(sealed, tmp_path_factory)
    shard = sorted((run / "drafts").glob("part-*.parquet"))[0]
    pl.read_parquet(shard).reverse().write_parquet(shard)
    monkeypatch.setattr(io, "check_shard_values", panics)
    with pytest.raises(SchemaError, match="SHA-256"):
        open_run(run)
