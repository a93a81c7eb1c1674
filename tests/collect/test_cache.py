"""Cache drafts: oracle yields, the teacher-forced model yield against real greedy steps, no
leakage from the future, the global tree's timing, and the table's checks."""

import json
import shutil

import numpy as np
import polars as pl
import pytest

from svt.collect.cache import (
    CacheDrafter,
    RequestFeatures,
    accepted_runs,
)
from svt.collect.cache_run import cache_rows_for_batch
from svt.config import CacheOptions
from svt.errors import ConfigError, SchemaError
from svt.features.char_classes import char_class_table
from svt.metrics.repetition import common_prefix
from svt.traces.io import open_run

from ..conftest import reseal


@pytest.mark.parametrize(("draft", "cont", "expected"), [
    ([5, 6, 7], [5, 6, 7, 8], 3),  # full match
    ([5, 6, 7], [9, 6, 7], 0),  # none
    ([5, 6, 7, 1], [5, 6, 2, 1], 2),  # partial: stops at the first difference
    ([5, 6, 7], [5, 6], 2),  # the continuation ends first
    ([], [1, 2], 0),  # no draft
])
def test_oracle_yield_is_the_common_prefix(draft, cont, expected):
    assert common_prefix(np.array(draft, dtype=np.int64), np.array(cont, dtype=np.int64)) == expected


def test_accepted_runs_against_a_slow_reference():
    rng = np.random.default_rng(0)
    for _ in range(50):
        m = rng.random(rng.integers(0, 30)) < 0.7
        k = int(rng.integers(1, 6))
        ref = []
        for t in range(m.size):
            n = 0
            while t + n < m.size and m[t + n] and n < k:
                n += 1
            ref.append(n)
        assert accepted_runs(m, k).tolist() == ref


def test_model_accepted_equals_the_real_greedy_steps(greedy_run):
    """At every position where a collected greedy step starts, the teacher-forced yield equals the
    accepted count of that step (capped by the tokens the request had left)."""
    run = open_run(greedy_run)
    steps = run.scan("steps").sort("request", "step").collect()
    cache = run.scan("cache_drafts").collect()
    n_out = run.scan("requests").select("request", pl.col("output_ids").list.len().alias("n")).collect()
    starts = steps.with_columns((pl.col("emitted").cum_sum().over("request") - pl.col("emitted")).alias("t"))
    joined = (starts.join(cache.select("request", pl.col("decode_pos").alias("t"), "model_accepted"),
                          on=["request", "t"]).join(n_out, on="request"))
    assert joined.height == steps.height
    # the final step of a request may be cut by max_new_tokens / EOS: the output holds fewer tokens
    left = (joined["n"] - joined["t"]).to_numpy()
    acc = np.minimum(joined["accepted"].to_numpy(), left)
    model = np.minimum(joined["model_accepted"].to_numpy(), left)
    assert (acc == model).all(), joined.filter(pl.Series(acc != model))
    assert joined["accepted"].max() > 0 and (joined["accepted"] < 4).any()


def test_run_json_records_cache_options_and_version(greedy_run):
    meta = json.loads((greedy_run / "run.json").read_text())
    assert meta["cache"]["options"]["max_draft_len"] == CacheOptions().max_draft_len
    assert meta["cache"]["arctic_inference"] and "cache" in meta["drafter_kinds"]
    d = open_run(greedy_run).scan("cache_drafts").collect()
    assert meta["cache"]["rows"] == d.height == meta["counts"]["output_tokens"]
    # one row per request and decode position
    assert d.select("request", "decode_pos").is_unique().all()
    out = open_run(greedy_run).scan("requests").collect()
    for r in out.iter_rows(named=True):
        rows = d.filter(pl.col("request") == r["request"]).sort("decode_pos")
        assert rows["decode_pos"].to_list() == list(range(len(r["output_ids"])))
        for row in rows.iter_rows(named=True):
            assert row["oracle_accepted"] == common_prefix(np.array(row["draft_ids"]),
                                                           np.array(r["output_ids"][row["decode_pos"]:]))


class _Tok:
    def decode(self, ids):
        return {0: "a", 1: "(", 2: "1", 3: " ", 4: "\n", 5: ",", 6: "bc"}.get(ids[0], "x")


def _rows(requests, steps, options=None):
    options = options or CacheOptions(max_tree_depth=8, max_draft_len=6, history=4)
    classes = char_class_table(_Tok(), 10)
    return cache_rows_for_batch(CacheDrafter(options), options, classes, pl.DataFrame(requests),
                                pl.DataFrame(steps))


def _one_step_per_token(req, n):
    return {"request": [req] * n, "step": list(range(n)), "emitted": [1] * n}


def test_features_at_t_ignore_the_output_after_t():
    prompt = [0, 1, 2, 3, 0, 1, 2, 3, 0, 1]
    out_a = [2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 4, 5]
    t = 6
    out_b = out_a[:t] + [7, 8, 9, 7, 8, 9]
    rows = []
    for out in (out_a, out_b):
        reqs = {"request": [0], "workload": ["w"], "prompt_ids": [prompt], "output_ids": [out]}
        rows.append(_rows(reqs, _one_step_per_token(0, len(out))))
    labels = {"oracle_accepted", "lookup_ms"}
    for u in range(t + 1):
        a = {k: v for k, v in rows[0][u].items() if k not in labels}
        b = {k: v for k, v in rows[1][u].items() if k not in labels}
        assert a == b, u
    # the labels do see the future: that is what makes them labels
    assert rows[0][t]["oracle_accepted"] != rows[1][t]["oracle_accepted"]
    assert rows[0][t]["draft_len"] > 0


def test_history_features_by_hand():
    f = RequestFeatures(CacheOptions(history=2), np.zeros((10, 6), dtype=np.float32), prompt_len=3)
    out = np.array([4, 5, 6, 7])
    f.row(0, out[:0], np.array([1, 2, 3]), np.array([4, 5, 9]), np.array([.5, .5, .5]), 1.5, 2, False)
    f.row(1, out[:1], np.array([1, 2, 3, 4]), np.array([]), np.array([]), 0.0, 0, False)
    r = f.row(2, out[:2], np.array([1, 2, 3, 4, 5]), np.array([6]), np.array([.9]), 0.9, 1, True)
    # drafts at 0 ([4, 5, 9]) and 1 (none); confirmed by out[:2] = [4, 5]: 2 and 0
    assert r["hist_yield_mean"] == 1.0 and r["hist_yield_max"] == 2.0 and r["hist_draft_share"] == 0.5
    assert r["prev_draft_len"] == 0 and r["prev_match_len"] == 0 and r["from_global"]


def test_a_response_enters_the_global_tree_after_its_last_step():
    """A and B in one batch; B repeats A's response. While A is still decoding (its last step is
    3) B cannot draft from it; when A finished at step 0, B drafts from it at once."""
    a_out, b_out = [0, 1, 2, 3], [0, 1, 2, 3, 9]
    reqs = {"request": [0, 1], "workload": ["w", "w"], "prompt_ids": [[6], [6]], "output_ids": [a_out, b_out]}
    b_steps = {"request": [1] * 5, "step": list(range(5)), "emitted": [1] * 5}
    slow = _rows(reqs, {k: [*v_a, *v_b] for (k, v_a), v_b in zip(_one_step_per_token(0, 4).items(),
                                                                   b_steps.values(), strict=True)})
    fast = _rows(reqs, {"request": [0, *b_steps["request"]], "step": [0, *b_steps["step"]],
                        "emitted": [4, *b_steps["emitted"]]})
    b_slow = [r for r in slow if r["request"] == 1]
    b_fast = [r for r in fast if r["request"] == 1]
    assert [r["draft_len"] for r in b_slow[1:4]] == [0, 0, 0]  # A is still running: nothing to copy
    # one token matched, and a draft is at most max_spec_factor (1) x match_len long
    assert b_fast[1]["from_global"] and b_fast[1]["draft_ids"] == [1] and b_fast[1]["oracle_accepted"] == 1
    assert b_fast[2]["draft_ids"] == [2, 3] and b_fast[2]["oracle_accepted"] == 2


def test_cache_needs_a_greedy_run_and_a_valid_config(small_run, models_dir):
    from svt.collect.cache_run import build_cache_drafts
    from svt.config import load_collect_config

    with pytest.raises(ConfigError, match="greedy"):
        build_cache_drafts(small_run, CacheOptions(), None, None)
    base = {"target": "t", "draft": "d", "workloads": ["code"]}
    with pytest.raises(ConfigError, match="temperature"):
        load_collect_config(None, base={**base, "cache": True})
    with pytest.raises(ConfigError, match="cache.max_draft_len"):
        load_collect_config(None, base={**base, "temperature": 0, "cache": {"max_draft_len": 0}})
    with pytest.raises(ConfigError, match="cache.bogus"):
        load_collect_config(None, base={**base, "temperature": 0, "cache": {"bogus": 1}})


def test_damaged_cache_table_is_refused(greedy_run, tmp_path):
    run = tmp_path / "r"
    shutil.copytree(greedy_run, run)
    shard = sorted((run / "cache_drafts").glob("part-*.parquet"))[0]
    d = pl.read_parquet(shard)
    d.with_columns(pl.col("oracle_accepted") + 50).write_parquet(shard)
    with pytest.raises(SchemaError, match="SHA-256"):
        open_run(run)
    reseal(run)  # as if a foreign writer had recorded the damaged shard: the value check catches it
    with pytest.raises(SchemaError, match="oracle_accepted"):
        open_run(run)


@pytest.mark.parametrize(("edit", "match"), [
    (lambda d: d.filter(pl.col("decode_pos") % 5 != 3), "one row per position"),
    (lambda d: pl.concat([d, d]), "one row per position"),
    (lambda d: d.with_columns(pl.col("oracle_accepted").clip(upper_bound=0).cast(pl.Int16)), "oracle or model yield"),
    (lambda d: d.with_columns(pl.lit(30).cast(pl.Int16).alias("model_accepted")), "oracle or model yield"),
])
def test_cache_rows_are_cross_checked_with_the_requests(greedy_run, tmp_path, edit, match):
    from svt.errors import DataError
    from svt.fit.yield_data import load_cache_drafts_for_fit

    run = tmp_path / "r"
    shutil.copytree(greedy_run, run)
    shard = sorted((run / "cache_drafts").glob("part-*.parquet"))[1]
    d = pl.read_parquet(shard)
    assert not edit(d).equals(d)  # the edit changes something
    edit(d).write_parquet(shard)
    reseal(run)
    with pytest.raises(DataError, match=match):
        load_cache_drafts_for_fit([run])


@pytest.mark.parametrize("col", ["lookup_ms", "context_len"])
def test_negative_cache_values_are_schema_errors(greedy_run, tmp_path, col):
    run = tmp_path / "r"
    shutil.copytree(greedy_run, run)
    shard = sorted((run / "cache_drafts").glob("part-*.parquet"))[0]
    d = pl.read_parquet(shard)
    d.with_columns((pl.col(col) * 0 - 1).cast(d.schema[col])).write_parquet(shard)
    reseal(run)
    with pytest.raises(SchemaError, match=col):
        open_run(run)


def test_hvd_tau_must_be_a_number():
    from svt.config import load_collect_config

    base = {"target": "t", "draft": "d", "workloads": ["code"], "temperature": 0, "batch_size": 1}
    with pytest.raises(ConfigError, match="hvd.tau"):
        load_collect_config(None, base={**base, "hvd": {"fit": "f.json", "tau": float("nan")}})
