"""A run read deeply on a cluster's workers (`svt.distributed.reading`) checks what open_run checks on
one machine, in its words, and gives the same data identity: the driver reads no drafts. The
engine here runs each task in this process (the dask path runs in test_cluster_evaluate)."""

from __future__ import annotations

import json
import shutil

import polars as pl
import pytest

from svt.distributed.reading import read_run
from svt.errors import SchemaError
from svt.traces.identity import run_identity
from svt.traces.io import open_run
from tests.conftest import reseal


class InProcess:
    """The engine interface's map, run here, task by task."""

    def map(self, fn, items, *args):
        return [fn(item, *args) for item in items]


def _copy(run, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(run, out)
    return out


def test_the_identity_merged_from_shards_is_the_single_machines(greedy_run):
    """Three drafts shards, each on its own task: the merged order-free sums give the same
    fingerprints and row count, and sketches equal to rounding."""
    assert len(list((greedy_run / "drafts").glob("*.parquet"))) >= 2
    run, got = read_run(greedy_run, InProcess())
    ref = run_identity(open_run(greedy_run))
    assert {k: got[k] for k in ("table", "sha256", "structure_sha256", "rows")} == {
        k: ref[k] for k in ("table", "sha256", "structure_sha256", "rows")}
    for c, v in ref["score_sketch"].items():
        assert got["score_sketch"][c] == pytest.approx(v, rel=1e-12, abs=1e-9)
    assert run.shards.keys() == open_run(greedy_run).shards.keys()


def test_a_changed_shard_is_refused_in_the_single_machines_words(greedy_run, tmp_path):
    run = _copy(greedy_run, tmp_path)
    shard = sorted((run / "steps").glob("*.parquet"))[-1]
    pl.read_parquet(shard).write_parquet(shard, compression="uncompressed")  # same values, other bytes
    with pytest.raises(SchemaError, match="SHA-256") as got:
        read_run(run, InProcess())
    with pytest.raises(SchemaError) as ref:
        open_run(run)
    assert str(got.value) == str(ref.value)


def _relabel(run):
    """A step's accepted count off by one (resealed: only the cross-table check sees it)."""
    shard = sorted((run / "steps").glob("*.parquet"))[-1]
    f = pl.read_parquet(shard)
    i = f.with_row_index("_i").filter((pl.col("accepted") > 0) & (pl.col("accepted") == pl.col("kept"))).row(0)[0]
    here = pl.int_range(pl.len()) == i
    f.with_columns(pl.when(here).then(pl.col("accepted") - 1).otherwise(pl.col("accepted"))
                   .cast(f.schema["accepted"]).alias("accepted"),
                   pl.when(here).then(pl.min_horizontal("emitted", "accepted")).otherwise(pl.col("emitted"))
                   .cast(f.schema["emitted"]).alias("emitted")).write_parquet(shard)
    reseal(run)


def test_tables_that_disagree_are_refused_in_the_single_machines_words(greedy_run, tmp_path):
    run = _copy(greedy_run, tmp_path)
    _relabel(run)
    with pytest.raises(SchemaError, match="disagree") as got:
        read_run(run, InProcess())
    with pytest.raises(SchemaError) as ref:
        open_run(run)
    assert str(got.value) == str(ref.value)


def test_shards_that_do_not_pair_by_name_are_checked_whole(greedy_run, tmp_path):
    """Steps shards renamed (the tables no longer pair): the cross-table check reads them whole on
    the driver, and still finds a disagreement."""
    run = _copy(greedy_run, tmp_path)
    _relabel(run)
    meta = json.loads((run / "run.json").read_text())
    for f in sorted((run / "steps").glob("part-*.parquet")):
        n = int(f.stem.split("-")[1])
        f.rename(f.with_name(f"part-{n + 100:05d}.parquet"))
    recs = meta["shards"]["steps"]
    meta["shards"]["steps"] = {f"part-{int(k[5:10]) + 100:05d}.parquet": v for k, v in recs.items()}
    (run / "run.json").write_text(json.dumps(meta))
    with pytest.raises(SchemaError, match="disagree"):
        read_run(run, InProcess())


def test_drafts_past_k_are_refused(greedy_run, tmp_path):
    run = _copy(greedy_run, tmp_path)
    meta = json.loads((run / "run.json").read_text())
    meta["k"] = meta["config"]["k"] = 3
    (run / "run.json").write_text(json.dumps(meta))
    with pytest.raises(SchemaError, match="drafts reach position 3, but run.json says K = 3"):
        read_run(run, InProcess())


def test_a_shard_left_unchecked_is_an_error_not_a_verified_run(greedy_run):
    from svt.distributed.reading import RunCheck, check_unit

    check = RunCheck.open(greedy_run)
    names = sorted(check.units)
    got = {n: check_unit(*check.task(n)) for n in names[:-1]}
    with pytest.raises(ValueError, match="left unchecked"):
        check.finish(got)
    got[names[-1]] = check_unit(*check.task(names[-1]))
    assert check.finish(got)["sha256"] == run_identity(open_run(greedy_run))["sha256"]
