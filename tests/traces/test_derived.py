"""Columns derivable from others are checked on read (issue 53): a run whose two copies of one
figure disagree is refused by open_run, naming the check and the first step, never evaluated into
two report tables that disagree. Each damage below is one realistic bug in a writer (a step's
counter off by one, a label on the wrong position, a probability from another distribution)."""

from __future__ import annotations

import shutil

import polars as pl
import pytest

from svt.collect import collect
from svt.config import load_collect_config
from svt.errors import SchemaError
from svt.traces.io import open_run
from tests.conftest import ROOT, reseal


def _damaged(run, tmp_path, table, change):
    bad = tmp_path / "bad"
    shutil.copytree(run, bad)
    shard = sorted((bad / table).glob("*.parquet"))[0]
    frame = pl.read_parquet(shard)
    changed = change(frame)
    assert not changed.equals(frame), "the damage changed nothing"
    changed.write_parquet(shard)
    reseal(bad)
    return bad


def _at(frame, cond) -> pl.Expr:
    """The rows of the first (request, step) of ``frame`` that meets ``cond`` (a row condition)."""
    r = frame.filter(cond).sort("request", "step").row(0, named=True)
    return (pl.col("request") == r["request"]) & (pl.col("step") == r["step"])


def _set(col, cond_of_frame, value):
    def change(f):
        where = cond_of_frame(f)
        return f.with_columns(pl.when(where).then(value).otherwise(pl.col(col)).cast(f.schema[col]).alias(col))
    return change


def _first_row(f, cond=None):
    r = f.with_row_index("_i").filter(pl.lit(True) if cond is None else cond).row(0, named=True)["_i"]
    return pl.int_range(pl.len()) == r


def _move_accept(f):
    """A step that accepted one draft: its 1 moved from position 0 to position 1 (its 0 to 0)."""
    step = f.group_by("request", "step").agg((pl.col("label") == 1).sum().alias("a"),
                                             (pl.col("label") == 0).sum().alias("r"))
    r = step.filter((pl.col("a") == 1) & (pl.col("r") == 1)).sort("request", "step").row(0, named=True)
    here = (pl.col("request") == r["request"]) & (pl.col("step") == r["step"])
    return f.with_columns(pl.when(here & (pl.col("position") == 0)).then(pl.lit(0, pl.Int8))
                          .when(here & (pl.col("position") == 1)).then(pl.lit(1, pl.Int8))
                          .otherwise(pl.col("label")).alias("label"))


CHAIN = [
    ("steps", _set("accepted", lambda f: _first_row(f, pl.col("accepted") < pl.col("kept")), pl.col("accepted") + 1),
     "labelled 1 other than the step's `accepted`"),
    ("drafts", _set("label", lambda f: _first_row(f, pl.col("label") == 0), pl.lit(None, pl.Int8)),
     "a rejected draft missing"),
    ("drafts", _move_accept, "not positions 0 .. accepted - 1"),
    ("drafts", lambda f: pl.concat([f, f.head(1)]), "outside [`kept`, `drafted`]"),
    ("drafts", lambda f: f.with_columns(pl.when(_first_row(f, pl.col("position") == 1)).then(0)
                                         .otherwise(pl.col("position")).cast(pl.Int16).alias("position")),
     "two drafts at one position"),
    ("drafts", _set("q_sampled", lambda f: _first_row(f, pl.col("q_max") < 0.9), pl.col("q_max") + 0.05),
     "`q_sampled` has 1 bad value(s): above `q_max`"),
    ("drafts", _set("p_sampled", lambda f: _first_row(f, pl.col("p_max") < 0.9), pl.col("p_max") + 0.05),
     "`p_sampled` has 1 bad value(s): above `p_max`"),
    ("steps", _set("kept", lambda f: _first_row(f), pl.col("drafted") + 1), "`kept` has 1 bad value(s): above `drafted`"),
    ("steps", _set("emitted", lambda f: _first_row(f), pl.col("accepted") + 2), "`emitted` has 1 bad value(s)"),
    ("steps", _set("kept", lambda f: _first_row(f, pl.col("accepted") + 1 < pl.col("drafted")), pl.col("drafted") - 1),
     "`explored` has 1 bad value(s)"),  # a step that kept fewer drafts than it drafted, said to be explored
    ("drafts", _set("accept_prob", lambda f: _first_row(f, pl.col("label") == 1), pl.col("accept_prob") * 0.5),
     "other than min(1, p_sampled / q_sampled)"),
    ("drafts", lambda f: f.with_columns(pl.when(_first_row(f, pl.col("position") == 0)).then(pl.lit("other"))
                                         .otherwise(pl.col("workload")).alias("workload")),
     "is workload 'other' in drafts"),
    ("steps", lambda f: f.filter(~_first_row(f)), "drafts of a step the steps table does not hold"),
    # every draft row of one verified step gone (its steps row kept): a step with no drafts at all
    ("drafts", lambda f: f.filter(~_at(f, pl.col("label").is_not_null())), "a step with `kept` > 0 but no drafts"),
]


@pytest.mark.parametrize("table,change,words", CHAIN)
def test_a_chain_run_whose_tables_disagree_is_refused(small_run, tmp_path, table, change, words):
    open_run(small_run)  # the run as collected passes
    bad = _damaged(small_run, tmp_path, table, change)
    with pytest.raises(SchemaError) as err:
        open_run(bad)
    assert words in str(err.value), err.value
    open_run(bad, deep=False)  # a shallow open reads the schema only


@pytest.fixture(scope="module")
def greedy_trees(tmp_path_factory, models_dir):
    base = {"target": str(models_dir / "target"), "draft": str(models_dir / "draft-large"),
            "workloads": [str(ROOT / "data" / "workloads" / "code.jsonl")], "requests": 3, "batch_size": 1,
            "max_new_tokens": 24, "device": "cpu", "max_prompt_tokens": 96, "temperature": 0.0,
            "tree": {"widths": [3, 2, 1]}}
    out = tmp_path_factory.mktemp("dtrees") / "greedy"
    collect(load_collect_config(None, base=base), out, progress=False)
    return out


TREE = [
    ("tree_drafts", _set("match", lambda f: _first_row(f, pl.col("label") == 1), pl.lit(0, pl.Int8)),
     "labelled 1 but its `match` is 0"),
    ("tree_drafts", _set("match", lambda f: _first_row(f, pl.col("label") == 0), pl.lit(1, pl.Int8)),
     "labelled 0 but its `match` is 1"),
    ("steps", _set("accepted", lambda f: _first_row(f), pl.col("accepted") + 1), "whose length is not the step's"),
    ("tree_drafts", _set("q_token", lambda f: _first_row(f, pl.col("q_max") < 0.9), pl.col("q_max") + 0.05),
     "`q_token` has 1 bad value(s): above `q_max`"),
    ("tree_drafts", _set("path_prob", lambda f: _first_row(f, pl.col("q_token") < 0.9), pl.col("q_token") + 0.05),
     "`path_prob` has 1 bad value(s)"),
    ("tree_drafts", _set("path_prob", lambda f: _first_row(f, pl.col("depth") == 1), pl.col("path_prob") * 0.5),
     "whose `path_prob` is not their parent's times their `q_token`"),
]


@pytest.mark.parametrize("table,change,words", TREE)
def test_a_tree_run_whose_tables_disagree_is_refused(greedy_trees, tmp_path, table, change, words):
    open_run(greedy_trees)
    bad = _damaged(greedy_trees, tmp_path, table, change)
    with pytest.raises(SchemaError) as err:
        open_run(bad)
    assert words in str(err.value), err.value


def test_a_step_split_over_two_shards_is_read_whole(small_run, tmp_path):
    """Shards that pair by name but split one step's drafts are checked over the whole run, not
    refused for a disagreement that is not there."""
    good = tmp_path / "split"
    shutil.copytree(small_run, good)
    drafts = sorted((good / "drafts").glob("*.parquet"))
    steps = sorted((good / "steps").glob("*.parquet"))
    if len(drafts) != 1:
        pytest.skip("the fixture has several shards")
    f, s = pl.read_parquet(drafts[0]), pl.read_parquet(steps[0])
    half = f.height // 2 + 1  # the cut falls inside a step
    f.head(half).write_parquet(drafts[0])
    f.tail(f.height - half).write_parquet(drafts[0].with_name("part-00001.parquet"))
    s.write_parquet(steps[0])
    s.head(0).write_parquet(steps[0].with_name("part-00001.parquet"))
    reseal(good)
    open_run(good)
