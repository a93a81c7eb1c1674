"""Evaluation of a run far larger than memory: shard by shard and one feature at a time (forced
here on a small synthetic run by lowering the threshold), against the in-memory path."""

import json

import numpy as np
import polars as pl
import pytest

from svt.metrics import ordered
from svt.report import EvaluateOptions, evaluate
from svt.traces import open_run
from svt.traces.synthetic import write_run


@pytest.fixture(scope="module")
def synthetic(small_run, tmp_path_factory):
    out = tmp_path_factory.mktemp("synthetic") / "syn"
    return write_run(small_run, out, 40_000, shard_labelled=9_000, steps_per_request=20, seed=3)


def test_synthetic_run_is_a_valid_run_of_whole_batches_in_replay_order(synthetic, small_run):
    run = open_run(synthetic)  # deep validation: schema, values, shard records
    meta = run.meta
    assert meta["status"] == "complete" and meta["synthetic"]["source_run_id"] == open_run(small_run).meta["run_id"]
    assert len(run.shards["drafts"]) >= 4
    lab = run.scan("drafts").filter(pl.col("label").is_not_null()).select(pl.len()).collect().item()
    assert lab == meta["synthetic"]["labelled"] and abs(lab - 40_000) < 0.1 * 40_000
    bs = meta["config"]["batch_size"]
    seen = set()
    for part in run.parts("drafts"):
        d = part.select("request", "step", "position").collect()
        reqs = set(d["request"].unique().to_list())
        assert not reqs & seen  # requests never span shards
        seen |= reqs
        key = d.select((pl.col("request") // bs).alias("b"), "step", "request", "position")
        assert key.equals(key.sort("b", "step", "request", "position"))  # replay order


def _strip(report):
    return {k: report[k] for k in ("features", "acceptance", "runs")}


def test_streamed_report_equals_the_in_memory_one(synthetic, monkeypatch):
    mem = evaluate([synthetic], EvaluateOptions(in_memory=True))
    monkeypatch.setattr(ordered, "LARGE", 5_000)  # one feature at a time, in-place sorts
    monkeypatch.setattr(ordered, "CHUNK", 7_000)
    big = evaluate([synthetic])
    monkeypatch.setattr(ordered, "CHUNK", 1 << 22)
    small = evaluate([synthetic], EvaluateOptions(in_memory=True))
    _same_report(small, mem)
    _same_report(big, mem)


def _same_report(one: dict, other: dict) -> None:
    """Counts, hard-label AUCs, ROC points and the acceptance tables exactly equal; float sums
    (log-loss, ECEs, soft-label AUCs: the walk in halves sums them in another order) to 1e-12."""
    a, b = _strip(one), _strip(other)
    assert a["runs"] == b["runs"]  # fingerprints too
    assert a["acceptance"] == b["acceptance"]
    assert sorted(a["features"]) == sorted(b["features"]) and sorted(one["length_calibration"]) == sorted(
        other["length_calibration"])
    for name, fa in a["features"].items():
        fb = b["features"][name]
        for scope in ("excluding_first", *[None]):
            x, y = (fa, fb) if scope is None else (fa[scope], fb[scope])
            for m in ("auc", "n", "accept_rate"):
                assert x[m] == y[m], (name, scope, m)  # integer sums: exactly equal
            for m in ("log_loss", "ece", "ece_mass", "brier", "mean_pred"):
                assert (x[m] is None and y[m] is None) or x[m] == pytest.approx(y[m], abs=1e-12)
        for k, block in fa["per_position"].items():
            assert block["auc"] == fb["per_position"][k]["auc"]
        for soft, block in fa["soft"].items():
            assert block["auc"] == pytest.approx(fb["soft"][soft]["auc"], abs=1e-12)
        assert fa["curves"]["roc"] == fb["curves"]["roc"]
    for name, c in one["length_calibration"].items():
        d = other["length_calibration"][name]
        assert c["steps"] == d["steps"] and c["k"] == d["k"]
        assert c["length_ece"] == pytest.approx(d["length_ece"], abs=1e-12)
        assert [x["count"] for x in c["bins"]] == [x["count"] for x in d["bins"]]


def test_fingerprint_ignores_row_order_and_sharding(synthetic):
    from svt.traces.identity import data_fingerprint

    run = open_run(synthetic)
    whole = run.scan("drafts").collect()
    shuffled = whole.sample(fraction=1.0, shuffle=True, seed=1)
    fp = data_fingerprint(run.parts("drafts"))
    assert fp == data_fingerprint(whole) == data_fingerprint(shuffled)
    changed = whole.with_columns(pl.when(pl.int_range(pl.len()) == 5).then(1 - pl.col("label").fill_null(0))
                                 .otherwise(pl.col("label")).alias("label"))
    assert data_fingerprint(changed) != fp
    assert data_fingerprint(whole.head(whole.height - 1)) != fp
    assert np.isfinite(len(fp)) and len(fp) == 16


def test_streamed_report_of_a_censored_run_keeps_labels_with_their_rows(small_run, tmp_path):
    """A live-AV run (only explored steps count): the semi-join with the explored steps must keep
    each shard's row order, since a shard is read column by column (a reviewer's reproduction)."""
    from svt.traces.io import record_shards, write_meta

    run = write_run(small_run, tmp_path / "cens", 30_000, shard_labelled=8_000, steps_per_request=20, seed=1)
    meta = open_run(run, deep=False).meta
    meta["av"] = {"fit": "none.json"}
    parts = sorted((run / "steps").glob("part-*.parquet"))
    rng = np.random.default_rng(0)
    for p in parts:  # about 30 % of the steps with a rejection trimmed after it, as live AV would
        st = pl.read_parquet(p)
        trim = pl.Series(rng.random(st.height) >= 0.7) & (st["accepted"] + 1 < st["drafted"])
        st.with_columns(pl.when(trim).then(pl.col("accepted") + 1).otherwise(pl.col("kept")).cast(pl.Int16).alias("kept"),
                        (~trim).alias("explored")).write_parquet(p)
    record_shards(meta, "steps", parts)
    write_meta(run, meta)
    streamed = evaluate([run])
    mem = evaluate([run], EvaluateOptions(in_memory=True))
    assert json.dumps(_strip(streamed), sort_keys=True) == json.dumps(_strip(mem), sort_keys=True)
    assert streamed["acceptance"]["labelled"] < open_run(run).meta["counts"]["labelled"]


def test_step_tables_in_file_order_match_the_sorted_reference(small_run):
    """Per-step sums summed in file order (one compiled loop) are the sorted reference's, and a frame
    whose steps are not contiguous runs of ascending positions falls back to the sort."""
    import polars as pl

    from svt.features import get_feature
    from svt.report.scoring import _steps_in_order, open_for_evaluation, step_parts, step_tables

    feats = [get_feature(n) for n in ("q_max", "q_sampled")]
    parts = step_parts(open_for_evaluation([small_run]), None)
    ref = step_tables(parts, feats, 10, sort=True)
    whole = pl.concat(parts).collect()
    assert _steps_in_order(whole.lazy(), feats) is not None  # the collector's order: the compiled path
    for frame in (whole, whole.reverse(), whole.sample(fraction=1.0, shuffle=True, seed=0)):
        got = step_tables([frame.lazy()], feats, 10)
        assert got[0] == pytest.approx(ref[0], rel=1e-12)
        for f in feats:
            a, b = got[1][f.name], ref[1][f.name]
            assert a["steps"] == b["steps"] and a["k"] == b["k"]
            assert a["length_ece"] == pytest.approx(b["length_ece"], rel=1e-9)
            assert [x["count"] for x in a["bins"]] == [x["count"] for x in b["bins"]]
            for x, y in zip(a["bins"], b["bins"], strict=True):
                assert x["mean_predicted"] == pytest.approx(y["mean_predicted"], rel=1e-9)
                assert x["mean_realised"] == pytest.approx(y["mean_realised"], rel=1e-12)
    assert _steps_in_order(whole.reverse().lazy(), feats) is None  # positions descend within a step
    assert whole.head(2)["step"].n_unique() == 1  # the first step has two drafts or more
    split = pl.concat([whole.slice(1), whole.head(1)])  # its first draft moved to the end: a step in two runs
    assert _steps_in_order(split.lazy(), feats) is None
    twice = pl.concat([whole.head(1), whole.head(1), whole.slice(1)])  # a position repeated within a step
    assert _steps_in_order(twice.lazy(), feats) is None
    last = whole.filter((pl.col("request") == whole["request"][-1]) & (pl.col("step") == whole["step"][-1]))
    runs = pl.concat([whole, last.with_columns(pl.lit(1, dtype=whole.schema["_run"]).alias("_run"))])
    got = _steps_in_order(runs.lazy(), feats)  # the same request and step in the next run: a new step
    assert got is not None and got["a"].size == ref[1][feats[0].name]["steps"] + 1



def test_step_heads_check_splits_on_every_path(small_run):
    """The compiled path's check that each step is one run of rows holds whether steps ascend within
    each request (the last-step table), descend (the heads' distinct count), or the request ids are
    too spread out for a table: the same sums as the sorted reference, and a split step is refused."""
    import polars as pl

    from svt.features import get_feature
    from svt.report.scoring import _steps_in_order, open_for_evaluation, step_parts, step_tables

    feats = [get_feature(n) for n in ("q_max", "q_sampled")]
    whole = pl.concat(step_parts(open_for_evaluation([small_run]), None)).collect()
    ref = step_tables([whole.lazy()], feats, 10, sort=True)
    backwards = whole.sort(["_run", "request", "step", "position"], descending=[False, False, True, False])
    spread = whole.with_columns(pl.col("request") * 10**12)  # no last-step table: ids far apart
    for frame in (backwards, spread):
        got = _steps_in_order(frame.lazy(), feats)
        assert got is not None and got["a"].size == ref[1][feats[0].name]["steps"]
        assert step_tables([frame.lazy()], feats, 10)[0] == pytest.approx(ref[0], rel=1e-12)
        split = pl.concat([frame.slice(1), frame.head(1)])  # the first step's first draft moved to the end
        assert _steps_in_order(split.lazy(), feats) is None
    interleaved = whole.sort(["_run", "step", "request", "position"])  # steps of many requests in turn
    got = _steps_in_order(interleaved.lazy(), feats)
    assert got is not None and sorted(got["q_max"].tolist()) == pytest.approx(
        sorted(_steps_in_order(whole.lazy(), feats)["q_max"].tolist()), rel=1e-12)
    # a step split around another request's step of the same number: its second run repeats the step
    a, b = (interleaved.filter((pl.col("request") == q) & (pl.col("step") == 0)) for q in interleaved["request"].unique()[:2])
    assert a.height >= 2
    rest = interleaved.filter(pl.col("step") > 0)
    split = pl.concat([a.head(a.height - 1), b, a.tail(1), rest])
    assert _steps_in_order(split.lazy(), feats) is None



def test_step_sums_take_score_columns_lent_and_copied():
    """Polars lends one chunk's memory (read-only) and copies several chunks (writable): a constant
    feature beside a logged one over two frames gives one of each, summed together."""
    import polars as pl

    from svt.features import Feature
    from svt.report.scoring import _steps_in_order

    a = pl.DataFrame({"request": [1, 1, 1], "step": [1, 1, 2], "position": [0, 1, 0], "label": [1, 0, 1],
                      "q_max": [0.5, 0.6, 0.7]},
                     schema_overrides={"request": pl.Int64, "step": pl.Int32, "position": pl.Int16, "label": pl.Int8})
    two = pl.concat([a.lazy(), a.with_columns(request=pl.lit(2, pl.Int64)).lazy()], rechunk=False)
    two = two.with_columns(_run=pl.lit(0, pl.Int64))
    feats = [Feature("q_max", pl.col("q_max").cast(pl.Float64), "", True, True),
             Feature("half", pl.lit(0.5, pl.Float64), "", True, True)]
    got = _steps_in_order(two, feats)
    assert got["a"].tolist() == [1, 1, 1, 1] and got["k"].tolist() == [2, 1, 2, 1]
    np.testing.assert_allclose(got["q_max"], [0.5 + 0.5 * 0.6, 0.7] * 2)
    np.testing.assert_allclose(got["half"], [0.75, 0.5] * 2)


def test_part_scores_are_float32_exactly_when_every_value_is(small_run):
    """A logged float32 probability is held as float32 (half the memory; every feature expression
    casts to Float64, so the values decide), a value that is no float32 keeps float64, unrounded."""
    import polars as pl

    from svt.features import get_feature
    from svt.report.scoring import _part_scores, open_for_evaluation

    parts = [p.filter(pl.col("label").is_not_null()) for p in open_for_evaluation([small_run]).parts[0]]
    counts = [p.select(pl.len()).collect().item() for p in parts]
    q = _part_scores(parts, get_feature("q_max"), counts)
    lq = _part_scores(parts, get_feature("logit_qmax"), counts)
    assert q.dtype == np.float32 and lq.dtype == np.float64
    whole = pl.concat(parts).collect()
    np.testing.assert_array_equal(lq, whole.select(get_feature("logit_qmax").expr.cast(pl.Float64)).to_series().to_numpy())


def test_large_path_frees_an_order_it_cannot_reuse_before_reading(synthetic, monkeypatch):
    """One feature at a time: a feature that starts a family (its sample descends along every kept
    order) finds no order kept when it is sorted, so two key arrays are never held at once; a
    monotone transform (logit_qmax after q_max) still shares its family's order, one sort per family,
    and its ordered pass (a weak reference to the order, so nothing is held)."""
    import svt.report.scoring as scoring

    monkeypatch.setattr(ordered, "LARGE", 5_000)
    kept, sorts = {}, []
    real_order, real_sort = ordered.order_keys, ordered._float32_order

    def order_keys(s, others=None, **kw):
        kept[len(kept)] = len(others or [])
        return real_order(s, others, **kw)

    monkeypatch.setattr(ordered, "order_keys", order_keys)
    monkeypatch.setattr(scoring, "order_keys", order_keys, raising=False)
    monkeypatch.setattr(ordered, "_float32_order", lambda *a, **k: sorts.append(1) or real_sort(*a, **k))
    passes, real_pass = [], ordered._ordered_pass
    monkeypatch.setattr(ordered, "_ordered_pass", lambda *a, **k: passes.append(1) or real_pass(*a, **k))
    feats = ["q_max", "logit_qmax", "entropy", "q_sampled", "logit_qsampled"]
    evaluate([synthetic], EvaluateOptions(features=feats))
    assert list(kept.values()) == [0, 1, 0, 0, 1]
    assert len(sorts) == 3
    assert len(passes) == 3  # a logit (no probability) shares its family's ordered pass


def test_acceptance_totals_are_the_labels(synthetic):
    """The acceptance block's totals (the sums of its per-position table) against the labels read
    directly: every labelled draft counted once, the rate their mean."""
    rep = evaluate([synthetic], EvaluateOptions(features=["q_max"]))
    labels = open_run(synthetic).scan("drafts").select("label").collect()["label"].drop_nulls()
    assert rep["acceptance"]["labelled"] == labels.len()
    assert rep["acceptance"]["rate"] == labels.cast(float).mean()
    assert sum(r["proposed"] for r in rep["acceptance"]["by_position"]) == open_run(synthetic).meta["counts"]["drafts"]


@pytest.mark.parametrize("values, dtype", [
    ([[0.5, 0.25], [0.1, 0.3], [0.75]], np.float64),  # exact, then not: float64 from there, unrounded
    ([[0.1], [0.5, 0.125]], np.float64),  # not from the first part
    ([[0.5], [0.375, 1.0], [0.0]], np.float32),  # exact throughout
])
def test_part_scores_switch_to_float64_at_the_first_inexact_value(values, dtype):
    import polars as pl

    from svt.features import get_feature
    from svt.report.scoring import _part_scores

    parts = [pl.LazyFrame({"q_max": pl.Series(v, dtype=pl.Float64)}) for v in values]
    got = _part_scores(parts, get_feature("q_max"), [len(v) for v in values])
    assert got.dtype == dtype
    np.testing.assert_array_equal(got, np.concatenate([np.asarray(v, dtype=np.float64) for v in values]))
