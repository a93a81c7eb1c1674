"""Run-directory IO: atomic shards, lazy reads, and one clear message for every kind of bad file."""

import json

import polars as pl
import pytest

from svt.errors import SchemaError
from svt.report.summary import acceptance_by_position, run_summary
from svt.traces import SCHEMA_VERSION, open_run, scan_runs, write_meta, write_shard


def _drafts(n=6, request=0):
    return pl.DataFrame({
        "workload": ["code"] * n,
        "request": [request] * n,
        "step": [0, 0, 0, 1, 1, 1][:n],
        "position": [0, 1, 2, 0, 1, 2][:n],
        "token": list(range(n)),
        "q_max": [0.9, 0.5, 0.4, 0.8, 0.7, 0.3][:n],
        "q_sampled": [0.9, 0.5, 0.1, 0.8, 0.2, 0.3][:n],
        "q_entropy": [0.3, 1.0, 1.2, 0.5, 0.9, 1.5][:n],
        "q_margin": [0.85, 0.2, 0.1, 0.7, 0.5, 0.1][:n],
        "p_sampled": [0.8, 0.1, 0.2, 0.9, 0.6, 0.1][:n],
        "p_max": [0.8, 0.6, 0.5, 0.9, 0.6, 0.5][:n],
        "accept_prob": [0.88, 0.2, 1.0, 1.0, 1.0, 0.33][:n],
        "accept_prob_expected": [0.8, 0.5, 0.6, 0.85, 0.7, 0.4][:n],
        "label": [1, 0, None, 1, 1, 0][:n],
    })


def _make_run(path, drafts=None):
    write_meta(path, {"schema_version": SCHEMA_VERSION, "run_id": f"t-{path.name}", "k": 3})
    write_shard(path, "drafts", 0, drafts if drafts is not None else _drafts())
    write_shard(path, "steps", 0, pl.DataFrame({
        "request": [0, 0], "step": [0, 1], "drafted": [3, 3], "accepted": [1, 2], "emitted": [2, 3],
        "draft_ms": [1.0, 1.1], "verify_ms": [2.0, 2.1], "batch_size": [1, 1], "kept": [3, 3],
        "explored": [True, True]}))
    write_shard(path, "requests", 0, pl.DataFrame({
        "request": [0], "workload": ["code"], "prompt_ids": [[1, 2]], "output_ids": [[3, 4, 5, 6, 7]],
        "finish_reason": ["length"]}))
    return path


def test_roundtrip_casts_to_schema_and_leaves_no_temporary_files(tmp_path):
    run = open_run(_make_run(tmp_path / "r"))
    df = run.scan("drafts").collect()
    assert df.schema["label"] == pl.Int8 and df.schema["q_max"] == pl.Float32
    assert df["label"].to_list() == [1, 0, None, 1, 1, 0]
    assert not list((tmp_path / "r").rglob(".*.tmp"))


def test_summary_and_acceptance_conventions(tmp_path):
    path = _make_run(tmp_path / "r")
    s = run_summary(path)
    assert s["labelled"] == 5 and s["acceptance"] == pytest.approx(3 / 5)
    assert s["mean_acceptance_length"] == pytest.approx(1 + 3 / 2)
    t = acceptance_by_position(path)
    row1 = t.filter(pl.col("position") == 1).row(0, named=True)
    assert (row1["proposed"], row1["verified"], row1["accepted"]) == (2, 2, 1)
    row2 = t.filter(pl.col("position") == 2).row(0, named=True)
    assert row2["conditional"] == 0.0 and row2["verified"] == 1 and row2["proposed"] == 2


def test_several_runs_scan_together(tmp_path):
    a, b = _make_run(tmp_path / "a"), _make_run(tmp_path / "b")
    df = scan_runs([a, b]).collect()
    assert df.height == 12 and set(df["run"]) == {"a", "b"}


def test_missing_run_json(tmp_path):
    (tmp_path / "r").mkdir()
    with pytest.raises(SchemaError, match="run.json: not found"):
        open_run(tmp_path / "r")


def test_foreign_schema_version(tmp_path):
    path = _make_run(tmp_path / "r")
    (path / "run.json").write_text(json.dumps({"schema_version": 99}))
    with pytest.raises(SchemaError, match="schema_version"):
        open_run(path)


def test_damaged_shard_names_the_file(tmp_path):
    path = _make_run(tmp_path / "r")
    bad = path / "drafts" / "part-00001.parquet"
    bad.write_bytes(b"not parquet at all")
    with pytest.raises(SchemaError, match=r"part-00001\.parquet: not a readable Parquet file"):
        open_run(path)


def test_missing_column_names_file_and_column(tmp_path):
    path = _make_run(tmp_path / "r")
    _drafts().drop("q_max").write_parquet(path / "drafts" / "part-00001.parquet")
    with pytest.raises(SchemaError, match=r"part-00001\.parquet: column `q_max` is missing"):
        open_run(path)


def test_wrong_type_names_file_and_column(tmp_path):
    path = _make_run(tmp_path / "r")
    _drafts().with_columns(pl.col("label").cast(pl.String)).write_parquet(path / "drafts" / "part-00001.parquet")
    with pytest.raises(SchemaError, match=r"column `label` has type String; expected integer"):
        open_run(path)


@pytest.mark.parametrize("col, value, what", [
    ("q_max", float("nan"), "NaN or outside"),
    ("accept_prob", 1.5, "NaN or outside"),
    ("label", 2, "a label other than 0, 1 or null"),
    ("request", None, "null, which"),
])
def test_bad_values_are_named(tmp_path, col, value, what):
    df = _drafts().with_columns(pl.when(pl.int_range(pl.len()) == 1).then(pl.lit(value)).otherwise(pl.col(col))
                                .cast(_drafts().schema[col]).alias(col))
    path = _make_run(tmp_path / "r", drafts=df)
    with pytest.raises(SchemaError, match=f"column `{col}` has 1 bad value\\(s\\): {what}"):
        open_run(path)
    open_run(path, deep=False)  # schema-only validation passes


def test_missing_required_table(tmp_path):
    path = _make_run(tmp_path / "r")
    (path / "steps" / "part-00000.parquet").unlink()
    with pytest.raises(SchemaError, match="every run needs a `steps` table"):
        open_run(path)


def _with_confidence(values=(0.9, 0.6, 0.4, 0.8, 0.7, 0.2)):
    return _drafts().with_columns(pl.Series("confidence", list(values), dtype=pl.Float64))


def test_an_optional_column_is_kept_typed_and_read_where_every_shard_carries_it(tmp_path):
    """A drafter's confidence (the schema's optional `confidence`) travels through write, read and
    several runs' scan; a run without it reads as before; a scan of both drops it (not every run has it)."""
    from svt.traces.io import carried_columns

    a = _make_run(tmp_path / "a", drafts=_with_confidence())
    run = open_run(a)
    assert run.carries("drafts", "confidence") and run.scan("drafts").collect_schema()["confidence"] == pl.Float32
    assert run.scan("drafts").collect()["confidence"].to_list() == pytest.approx([0.9, 0.6, 0.4, 0.8, 0.7, 0.2])
    b = _make_run(tmp_path / "b")
    assert not open_run(b).carries("drafts", "confidence") and "confidence" not in open_run(b).scan("drafts").collect_schema()
    assert "confidence" in scan_runs([a, a.parent / "a"][:1]).collect_schema()
    assert "confidence" not in scan_runs([a, b]).collect_schema()
    assert carried_columns([a]) == {"confidence"} and carried_columns([a, b]) == set()


def test_a_shard_that_carries_an_optional_column_its_siblings_do_not_is_an_error(tmp_path):
    path = _make_run(tmp_path / "r")
    _with_confidence().with_columns(pl.col("request") + 1).write_parquet(path / "drafts" / "part-00001.parquet")
    with pytest.raises(SchemaError, match=r"part-00001.parquet: carries the column `confidence`, which .*part-00000"
                                          r".* does not: the shards of `drafts` are not one run's"):
        open_run(path, deep=False)


@pytest.mark.parametrize("values, what", [((0.9, 1.5, 0.4, 0.8, 0.7, 0.2), "column `confidence` has 1 bad value"),
                                          (("a",) * 6, "column `confidence` has type String")])
def test_an_optional_columns_values_and_type_are_checked(tmp_path, values, what):
    df = _drafts().with_columns(pl.Series("confidence", list(values)))
    path = tmp_path / "r"
    write_meta(path, {"schema_version": SCHEMA_VERSION, "run_id": "t", "k": 3})
    _make_run(path)
    df.write_parquet(path / "drafts" / "part-00000.parquet")
    with pytest.raises(SchemaError, match=what):
        open_run(path)


def test_a_steps_forward_time_beyond_the_step_is_an_error(tmp_path):
    path = _make_run(tmp_path / "r")
    sched = pl.DataFrame({"tick": [0, 1], "batch_size": [1, 1], "admitted": [1, 0], "prefill_ms": [1.0, 0.0],
                          "draft_ms": [1.0, 1.0], "verify_ms": [2.0, 2.0], "step_ms": [3.5, 3.5], "draft_passes": [3, 3],
                          "verify_tokens": [4, 4], "emitted": [2, 3], "forward_ms": [3.0, 3.0]})
    write_shard(path, "schedule", 0, sched)
    open_run(path)  # within the step: fine
    write_shard(path, "schedule", 0, sched.with_columns(pl.Series("forward_ms", [3.0, 4.0])))
    with pytest.raises(SchemaError, match="column `forward_ms` has 1 bad value"):
        open_run(path)


def test_a_cache_narrower_than_the_verified_positions_is_an_error(tmp_path):
    path = _make_run(tmp_path / "r")
    sched = pl.DataFrame({"tick": [0, 1], "batch_size": [2, 2], "admitted": [2, 0], "prefill_ms": [1.0, 0.0],
                          "draft_ms": [1.0, 1.0], "verify_ms": [2.0, 2.0], "step_ms": [3.5, 3.5], "draft_passes": [3, 3],
                          "verify_tokens": [8, 8], "emitted": [2, 3], "verify_slots": [40, 44]})
    write_shard(path, "schedule", 0, sched)
    open_run(path)
    write_shard(path, "schedule", 0, sched.with_columns(pl.Series("verify_slots", [40, 3], dtype=pl.Int32)))
    with pytest.raises(SchemaError, match="column `verify_slots` has 1 bad value"):
        open_run(path)
