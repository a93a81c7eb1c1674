"""A run is checked as a whole (issue 67): edits that keep every table valid alone — shards rewritten
and resealed, run.json's counts updated as a careful editor would — but make an impossible run are
one clear error naming the run, the table and the first offending row, on one machine and on the
cluster's shard-by-shard read alike."""

from __future__ import annotations

import math
import shutil

import polars as pl
import pytest

from svt.distributed.reading import read_run
from svt.errors import SchemaError
from svt.traces.io import open_run, read_meta, write_meta
from tests.conftest import reseal
from tests.distributed.test_reading import InProcess


def _edited(run, tmp_path, edits: dict) -> object:
    """A copy of ``run`` with ``edits[table](frame)`` applied to every shard of each table, resealed."""
    bad = tmp_path / "bad"
    shutil.copytree(run, bad)
    for table, change in edits.items():
        for shard in sorted((bad / table).glob("*.parquet")):
            change(pl.read_parquet(shard)).write_parquet(shard)
    reseal(bad)
    return bad


def _refused_everywhere(bad, words: str) -> None:
    with pytest.raises(SchemaError) as one:
        open_run(bad)
    assert words in str(one.value) and str(bad) in str(one.value), one.value
    with pytest.raises(SchemaError) as cluster:
        read_run(bad, InProcess())
    assert words in str(cluster.value), cluster.value


def _first_request(f):
    return pl.col("request") == f["request"].min()


EVERY_OTHER = (pl.col("step") % 2 == 0) | (pl.col("step") == 1)  # steps 0, 1, 2, 4, 6, ...: gaps from 3 on


CASES = [
    # every step of a shard held twice (inspect read 2.127 accepted a step where evaluate read 2.207)
    ({"steps": lambda f: pl.concat([f, f])}, "a (request, step) pair held twice"),
    # a step that emits nothing, and phantom steps where nothing was drafted, kept, accepted or emitted
    ({"steps": lambda f: f.with_columns(pl.when(pl.int_range(pl.len()) == 0).then(0).otherwise(pl.col("emitted"))
                                        .cast(pl.Int16).alias("emitted"))}, "a step that emits no token"),
    ({"steps": lambda f: pl.concat([f, f.filter(_first_request(f)).tail(1).with_columns(
        pl.col("step") + 1, *(pl.lit(0, pl.Int16).alias(c) for c in ("drafted", "accepted", "emitted", "kept")))])},
     "a step that emits no token"),
    # every second step removed from drafts and steps alike
    ({"steps": lambda f: f.filter(EVERY_OTHER), "drafts": lambda f: f.filter(EVERY_OTHER)}, "step numbers with gaps"),
    # an output cut to one token while its steps emit many
    ({"requests": lambda f: f.with_columns(pl.when(pl.int_range(pl.len()) == 0).then(pl.col("output_ids").list.head(1))
                                           .otherwise(pl.col("output_ids")).alias("output_ids"))},
     "do not add up to the request's output length"),
    # a step said to decode more rows than the run's batch
    ({"steps": lambda f: f.with_columns(pl.when(pl.int_range(pl.len()) == 0).then(99).otherwise(pl.col("batch_size"))
                                        .cast(pl.Int16).alias("batch_size"))}, "above the run's batch size"),
    # an entropy below -ln q_max (the entropy feature's AUC became 0.0 without a word)
    ({"drafts": lambda f: f.with_columns(pl.when(pl.col("q_max") < 0.5).then(0.0).otherwise(pl.col("q_entropy"))
                                         .cast(pl.Float32).alias("q_entropy"))}, "below -ln `q_max`"),
    ({"drafts": lambda f: f.with_columns(pl.when(pl.int_range(pl.len()) == 0).then(-0.01).otherwise(pl.col("q_margin"))
                                         .cast(pl.Float32).alias("q_margin"))}, "`q_margin` has 1 bad value(s)"),
]


@pytest.mark.parametrize("edits,words", CASES, ids=[w for _, w in CASES])
def test_an_impossible_run_is_refused_on_one_machine_and_on_the_cluster(small_run, tmp_path, edits, words):
    open_run(small_run)
    read_run(small_run, InProcess())  # the run as collected passes both
    _refused_everywhere(_edited(small_run, tmp_path, edits), words)


def test_the_entropy_bound_holds_on_real_drafts(small_run):
    """The bound the check enforces holds on every draft svt logged (no false alarm at float32)."""
    d = pl.read_parquet(small_run / "drafts" / "*.parquet")
    gap = (d["q_entropy"].cast(pl.Float64) + d["q_max"].cast(pl.Float64).log()).min()
    assert gap >= -1e-4 and math.isfinite(gap)


def _drop_last_batch(run, tmp_path, *, update_counts: bool):
    bad = tmp_path / "dropped"
    shutil.copytree(run, bad)
    for table_dir in bad.iterdir():
        shards = sorted(table_dir.glob("*.parquet")) if table_dir.is_dir() else []
        if shards:
            shards[-1].unlink()
    counts = dict(read_meta(bad)["counts"])
    reseal(bad)  # shard records (and counts) of what is left
    if not update_counts:
        meta = read_meta(bad)
        meta["counts"] = counts
        write_meta(bad, meta)
    return bad


@pytest.mark.parametrize("update_counts,words", [(False, "run.json counts"), (True, "batch(es)")])
def test_whole_batches_removed_while_run_json_counts_them_are_refused(greedy_run, tmp_path, update_counts, words):
    """8 requests in 4 batches in run.json, 2 in 1 in the tables: read as "verified against
    run.json" and scored on what was left, where it must be refused (shallow reads too)."""
    assert read_meta(greedy_run)["batches"] == 3
    bad = _drop_last_batch(greedy_run, tmp_path, update_counts=update_counts)
    for deep in (False, True):
        with pytest.raises(SchemaError, match=words):
            open_run(bad, deep=deep)
    with pytest.raises(SchemaError, match=words):
        read_run(bad, InProcess())


def test_a_continuous_runs_schedule_above_its_slots_is_refused(dspark_run, tmp_path):
    open_run(dspark_run)
    bad = _edited(dspark_run, tmp_path, {"schedule": lambda f: f.with_columns(
        pl.when(pl.int_range(pl.len()) == 0).then(5).otherwise(pl.col("batch_size")).cast(pl.Int16).alias("batch_size"))})
    _refused_everywhere(bad, "above the run's 4 slots")


def test_an_optional_table_removed_whole_is_absent_not_damaged(greedy_run, tmp_path):
    """run.json counts the cache drafts; the folder removed to save space: the run still reads."""
    run = tmp_path / "lean"
    shutil.copytree(greedy_run, run)
    assert read_meta(run)["counts"]["cache_drafts"] > 0
    for table in ("cache_drafts", "cache_trees"):
        shutil.rmtree(run / table, ignore_errors=True)
    open_run(run, deep=False)
    read_run(run, InProcess())


def test_a_request_repeated_in_another_shard_is_refused_on_the_cluster_too(greedy_run, tmp_path):
    """A request's rows (its requests row, steps and drafts) copied whole into another batch's shards:
    each shard alone is whole, so the cluster's shard-by-shard check passes each; the same (request,
    step) in two shards is caught by reading the run whole, on the cluster as on one machine."""
    bad = tmp_path / "dup"
    shutil.copytree(greedy_run, bad)
    r0 = pl.read_parquet(sorted((bad / "requests").glob("*.parquet"))[0])["request"][0]
    for table in ("requests", "steps", "drafts"):
        shards = sorted((bad / table).glob("*.parquet"))
        first, second = pl.read_parquet(shards[0]), pl.read_parquet(shards[1])
        pl.concat([second, first.filter(pl.col("request") == r0)]).write_parquet(shards[1])
    reseal(bad)
    for read in (open_run, lambda r: read_run(r, InProcess())):
        with pytest.raises(SchemaError, match="held twice"):
            read(bad)
