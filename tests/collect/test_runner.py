"""The collector end to end on the tiny pair: run directory, resume, refusals."""

import json

import polars as pl
import pytest

from svt.collect import collect
from svt.config import load_collect_config
from svt.errors import ConfigError
from svt.traces import open_run
from svt.traces import rundir as rundir_mod


@pytest.fixture()
def cfg(tmp_path, models_dir):
    (tmp_path / "w1.jsonl").write_text(
        json.dumps({"prompt": "def add(a, b):\n    return"}) + "\n"
        + json.dumps({"prompt": "import sys\nimport os\n"}) + "\n"
        + json.dumps({"prompt": "class Point:\n    def __init__(self"}) + "\n")
    (tmp_path / "w2.jsonl").write_text("".join(
        json.dumps({"messages": [{"role": "user", "content": text}]}) + "\n"
        for text in ("# A table of squares\nSQUARES = {", "# Constants\nPI =", "for i in range(")))
    base = {"target": str(models_dir / "target"), "draft": str(models_dir / "draft-small"),
            "workloads": [str(tmp_path / "w1.jsonl"), str(tmp_path / "w2.jsonl")],
            "requests": 6, "batch_size": 2, "max_new_tokens": 10, "k": 3, "device": "cpu",
            "log": {"hidden": True, "dists_fraction": 0.3, "dists_top_k": 4}}
    return load_collect_config(None, base=base)


def _tables(path):
    run = open_run(path)
    key = ["request", "step", "position"]
    return {
        "drafts": run.scan("drafts").sort(key).collect(),
        "steps": run.scan("steps").drop("draft_ms", "verify_ms").sort(["request", "step"]).collect(),
        "requests": run.scan("requests").sort("request").collect(),
        "hidden": run.scan("hidden").sort(key).collect(),
        "dists": run.scan("dists").sort(key).collect(),
    }


def test_collect_writes_a_valid_run(cfg, tmp_path):
    s = collect(cfg, tmp_path / "run", progress=False)
    assert s.requests == 6 and s.labelled > 0
    t = _tables(tmp_path / "run")
    assert t["requests"]["workload"].to_list() == ["w1", "w2", "w1", "w2", "w1", "w2"]
    assert (t["requests"]["output_ids"].list.len() <= 10).all()
    # labels follow the seed rule: 1s, then at most one 0, then nulls
    for _, g in t["drafts"].group_by(["request", "step"]):
        lab = g.sort("position")["label"].to_list()
        n1 = sum(1 for x in lab if x == 1)
        assert lab[:n1] == [1] * n1
        rest = lab[n1:]
        assert rest == [] or (rest[0] == 0 and all(x is None for x in rest[1:]))
    steps = t["steps"]
    assert (steps["emitted"] <= steps["accepted"] + 1).all()
    acc = t["drafts"].group_by(["request", "step"]).agg((pl.col("label") == 1).sum().alias("a"))
    joined = steps.join(acc, on=["request", "step"])
    assert (joined["a"] == joined["accepted"]).all()
    assert t["hidden"].height == t["drafts"].height
    meta = json.loads((tmp_path / "run" / "run.json").read_text())
    assert meta["status"] == "complete" and meta["counts"]["drafts"] == t["drafts"].height
    assert meta["models"]["target"]["weights_sha256_16"]


def test_resume_after_interrupt_equals_uninterrupted(cfg, tmp_path, monkeypatch):
    collect(cfg, tmp_path / "full", progress=False)
    real = rundir_mod.write_shard

    def flaky(run_dir, table, shard, frame):
        if shard == 1 and table == "steps":  # batch 1 half written: drafts yes, requests no
            raise KeyboardInterrupt
        return real(run_dir, table, shard, frame)

    monkeypatch.setattr(rundir_mod, "write_shard", flaky)
    with pytest.raises(KeyboardInterrupt):
        collect(cfg, tmp_path / "part", progress=False)
    assert (tmp_path / "part" / "drafts" / "part-00001.parquet").exists()
    monkeypatch.setattr(rundir_mod, "write_shard", real)
    with pytest.raises(ConfigError, match="not empty"):
        collect(cfg, tmp_path / "part", progress=False)
    s = collect(cfg, tmp_path / "part", resume=True, progress=False)
    assert s.resumed_batches == 1
    full, part = _tables(tmp_path / "full"), _tables(tmp_path / "part")
    for name in full:
        assert full[name].equals(part[name]), name


def test_resume_refuses_a_different_config(cfg, tmp_path):
    collect(cfg, tmp_path / "run", progress=False)
    cfg.temperature = 0.5
    with pytest.raises(ConfigError, match="differs in temperature"):
        collect(cfg, tmp_path / "run", resume=True, progress=False)


def test_resume_refuses_committed_requests_of_other_prompts(cfg, tmp_path):
    """The same config and prompt files can pick other prompts (a picking rule changed between two
    sessions): a committed request whose prompt tokens are not this session's is refused by name."""
    from tests.conftest import reseal

    collect(cfg, tmp_path / "run", progress=False)
    shard = sorted((tmp_path / "run" / "requests").glob("*.parquet"))[0]
    f = pl.read_parquet(shard)
    f.with_columns(pl.when(pl.int_range(pl.len()) == 0).then(pl.col("prompt_ids").list.concat(pl.lit([7], pl.List(pl.Int32))))
                   .otherwise(pl.col("prompt_ids")).alias("prompt_ids")).write_parquet(shard)
    reseal(tmp_path / "run")
    meta = json.loads((tmp_path / "run" / "run.json").read_text())
    meta["status"] = "running"
    (tmp_path / "run" / "run.json").write_text(json.dumps(meta))
    with pytest.raises(ConfigError, match=f"request {f['request'][0]} was committed with other prompt tokens"):
        collect(cfg, tmp_path / "run", resume=True, progress=False)


def test_overwrite_refuses_a_directory_that_is_not_a_run(cfg, tmp_path):
    d = tmp_path / "precious"
    d.mkdir()
    (d / "thesis.tex").write_text("x")
    with pytest.raises(ConfigError, match="not a run directory"):
        collect(cfg, d, overwrite=True, progress=False)
    assert (d / "thesis.tex").exists()


def test_greedy_run_soft_labels_are_the_outcome(cfg, tmp_path):
    cfg.temperature = 0.0
    collect(cfg, tmp_path / "g", progress=False)
    d = open_run(tmp_path / "g").scan("drafts").filter(pl.col("label").is_not_null()).collect()
    assert (d["accept_prob"] == d["label"].cast(pl.Float32)).all()
    meta = json.loads((tmp_path / "g" / "run.json").read_text())
    assert meta["sampling"]["greedy"] is True
