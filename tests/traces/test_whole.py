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


# the second hostile probe's edits (each accepted before, most moving a reported number)
def _without(f, request):
    return f.filter(pl.col("request") != request) if "request" in f.columns else f


PROBE_CASES = [
    # a request's steps and drafts all gone while its output stays (acceptance 0.607 -> 0.733)
    ({t: (lambda f: _without(f, 0)) for t in ("steps", "drafts", "hidden", "dists")}, "no step rows"),
    # a requests row held twice (the realism figure moved)
    ({"requests": lambda f: pl.concat([f, f.head(1)])}, "holds request"),
    # an engine tick logged twice
    ({"schedule": lambda f: pl.concat([f, f.head(1)])}, "an engine tick held more than once"),
    # an infinite entropy (no upper bound stopped it; the entropy AUC moved)
    ({"drafts": lambda f: f.with_columns(pl.when(pl.int_range(pl.len()) == 0).then(float("inf"))
                                         .otherwise(pl.col("q_entropy")).cast(pl.Float32).alias("q_entropy"))},
     "`q_entropy` has 1 bad value(s)"),
    # a step time that is no time
    ({"steps": lambda f: f.with_columns(pl.when(pl.int_range(pl.len()) == 0).then(float("nan"))
                                        .otherwise(pl.col("draft_ms")).cast(pl.Float32).alias("draft_ms"))},
     "`draft_ms` has 1 bad value(s)"),
    # a request's steps renumbered consistently (drafts and steps alike), far from the engine's ticks
    ({t: (lambda f: f.with_columns(pl.when(pl.col("request") == 0).then(pl.col("step") + 100)
                                   .otherwise(pl.col("step")).cast(f["step"].dtype).alias("step")))
      for t in ("steps", "drafts", "hidden", "dists")}, "steps not numbered from 0"),
    # an output ended by a reason svt's engine never writes
    ({"requests": lambda f: f.with_columns(pl.when(pl.int_range(pl.len()) == 0).then(pl.lit("banana"))
                                           .otherwise(pl.col("finish_reason")).alias("finish_reason"))},
     "a finish_reason other than stop or length"),
    # token ids below 0: in an output (its length kept), and in a draft
    ({"requests": lambda f: f.with_columns(pl.when(pl.int_range(pl.len()) == 0)
                                           .then(pl.concat_list(pl.lit(-7, pl.Int32), pl.col("output_ids").list.slice(1)))
                                           .otherwise(pl.col("output_ids")).alias("output_ids"))},
     "`output_ids` has 1 bad value(s)"),
    ({"drafts": lambda f: f.with_columns(pl.when(pl.int_range(pl.len()) == 0).then(-7).otherwise(pl.col("token"))
                                         .cast(pl.Int32).alias("token"))}, "`token` has 1 bad value(s)"),
]


@pytest.mark.parametrize("edits,words", PROBE_CASES, ids=[w for _, w in PROBE_CASES])
def test_the_probes_impossible_runs_are_refused_on_one_machine_and_on_the_cluster(small_run, tmp_path, edits, words):
    _refused_everywhere(_edited(small_run, tmp_path, edits), words)


def test_steps_renumbered_in_a_continuous_run_are_refused_against_its_ticks(dspark_run, tmp_path):
    """A continuous run's steps are its engine ticks: renumbered consistently they hold no gap, and
    only the schedule says they are not the ticks the engine ran."""
    shift = {t: (lambda f: f.with_columns(pl.when(pl.col("request") == 0).then(pl.col("step") + 1000)
                                          .otherwise(pl.col("step")).cast(f["step"].dtype).alias("step")))
             for t in ("steps", "drafts", "hidden", "dists")}
    _refused_everywhere(_edited(dspark_run, tmp_path, shift), "steps logged at a tick the schedule table does not hold")


def _last_step_cut(run, tmp_path):
    """A request that ran to max_new_tokens loses its last step (drafts and steps), its output cut
    by what that step emitted and the schedule made to agree: every table adds up, but the output
    ended by `length` is shorter than max_new_tokens."""
    from tests.conftest import outputs_agreeing, schedule_agreeing

    bad = tmp_path / "cut"
    shutil.copytree(run, bad)
    req = pl.read_parquet(bad / "requests" / "*.parquet")
    r = req.filter(pl.col("finish_reason") == "length")["request"][0]
    last = pl.read_parquet(bad / "steps" / "*.parquet").filter(pl.col("request") == r)["step"].max()
    for t in ("steps", "drafts", "hidden", "dists"):
        for shard in sorted((bad / t).glob("*.parquet")):
            f = pl.read_parquet(shard)
            f.filter(~((pl.col("request") == r) & (pl.col("step") == last))).write_parquet(shard)
    outputs_agreeing(bad)
    for shard in sorted((bad / "requests").glob("*.parquet")):  # (it says "stop"; an editor keeps `length`)
        f = pl.read_parquet(shard)
        f.with_columns(pl.when(pl.col("request") == r).then(pl.lit("length")).otherwise(pl.col("finish_reason"))
                       .alias("finish_reason")).write_parquet(shard)
    schedule_agreeing(bad)
    reseal(bad)
    return bad


def test_an_output_ended_by_length_short_of_max_new_tokens_is_refused(small_run, tmp_path):
    _refused_everywhere(_last_step_cut(small_run, tmp_path), "other than max_new_tokens (48) tokens long")


def test_a_step_cut_short_before_the_requests_end_is_refused(small_run, tmp_path):
    """A mid-request step that accepted drafts but emitted fewer than accepted + 1 (its output and the
    schedule cut to agree): only a request's end cuts a step short."""
    from tests.conftest import outputs_agreeing, schedule_agreeing

    bad = tmp_path / "short"
    shutil.copytree(small_run, bad)
    steps = pl.read_parquet(bad / "steps" / "*.parquet").filter(pl.col("request") == 0)
    at = steps.filter((pl.col("accepted") >= 1) & (pl.col("step") < steps["step"].max()))["step"].min()
    for shard in sorted((bad / "steps").glob("*.parquet")):
        f = pl.read_parquet(shard)
        hit = (pl.col("request") == 0) & (pl.col("step") == at)
        f.with_columns(pl.when(hit).then(pl.col("emitted") - 1).otherwise(pl.col("emitted"))
                       .cast(f["emitted"].dtype).alias("emitted")).write_parquet(shard)
    outputs_agreeing(bad)
    for shard in sorted((bad / "requests").glob("*.parquet")):
        f = pl.read_parquet(shard)
        f.with_columns(pl.when(pl.col("request") == 0).then(pl.lit("stop")).otherwise(pl.col("finish_reason"))
                       .alias("finish_reason")).write_parquet(shard)
    schedule_agreeing(bad)
    reseal(bad)
    _refused_everywhere(bad, "emitting other than its accepted drafts + 1")


META_CASES = [
    (lambda m: m["counts"].__setitem__("steps", str(m["counts"]["steps"])), "counts.steps is '"),
    (lambda m: m["counts"].__setitem__("drafts", float(m["counts"]["drafts"])), "counts.drafts is "),
    (lambda m: m.__setitem__("batches", 2.0), "`batches` is 2.0"),
    (lambda m: m["config"].__setitem__("batch_size", "9"), "`config.batch_size` is '9'"),
    (lambda m: m.__setitem__("config", "x"), "`config` is 'x': expected a mapping"),
    (lambda m: m.__setitem__("schedule", 5), "`schedule` is 5: expected a mapping"),
    (lambda m: m["shards"].__setitem__("drafts", [1, 2]), "`shards.drafts` is [1, 2]"),
    (lambda m: m["shards"]["drafts"].__setitem__(next(iter(m["shards"]["drafts"])), None), "expected a record"),
    (lambda m: next(iter(m["shards"]["drafts"].values())).__setitem__("rows", "135"), "rows` is '135'"),
    (lambda m: m.__setitem__("status", "done"), "`status` is 'done'"),
]


@pytest.mark.parametrize("edit,words", META_CASES, ids=[w for _, w in META_CASES])
def test_run_json_entries_of_the_wrong_type_are_one_message(small_run, tmp_path, edit, words):
    """A count that is a string used to switch its check off; a record that is no mapping, a config
    that is a string, crashed deep inside a report."""
    import json

    bad = tmp_path / "meta"
    shutil.copytree(small_run, bad)
    meta = json.loads((bad / "run.json").read_text())
    edit(meta)
    (bad / "run.json").write_text(json.dumps(meta))
    with pytest.raises(SchemaError, match=None) as err:
        open_run(bad, deep=False)
    assert words in str(err.value), err.value


def test_a_run_json_without_status_is_still_counted(small_run, tmp_path):
    """Deleting `status` switched the counts check off while the run read as complete."""
    import json

    bad = tmp_path / "nostatus"
    shutil.copytree(small_run, bad)
    meta = json.loads((bad / "run.json").read_text())
    del meta["status"]
    meta["counts"]["steps"] = 1
    (bad / "run.json").write_text(json.dumps(meta))
    with pytest.raises(SchemaError, match="run.json counts 1 rows of `steps`"):
        open_run(bad, deep=False)
