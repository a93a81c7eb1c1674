"""The tree engine end to end on the built-in pair: a `tree:` config writes labelled trees whose
labels, steps and outputs agree, read back by the run validator; bad tree configs are refused."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from svt.collect import collect
from svt.config import load_collect_config
from svt.errors import ConfigError, SchemaError
from svt.traces.io import open_run
from tests.conftest import ROOT, reseal


def _cfg(models_dir, **over):
    base = {"target": str(models_dir / "target"), "draft": str(models_dir / "draft-large"),
            "workloads": [str(ROOT / "data" / "workloads" / f"{w}.jsonl") for w in ("code", "prose")],
            "requests": 3, "batch_size": 1, "max_new_tokens": 24, "device": "cpu", "max_prompt_tokens": 128,
            "tree": {"top_m": 3, "depth": 4, "nodes": 10}}
    base.update(over)
    return load_collect_config(None, base=base)


@pytest.fixture(scope="module", params=["sampling-eagle2", "greedy-static"])
def tree_run(request, tmp_path_factory, models_dir):
    over = ({"temperature": 1.0} if request.param == "sampling-eagle2"
            else {"temperature": 0.0, "tree": {"widths": [2, 2, 1]}})
    out = tmp_path_factory.mktemp("trees") / request.param
    collect(_cfg(models_dir, **over), out, progress=False)
    return request.param, out


def test_tree_run_labels_steps_and_outputs_agree(tree_run):
    kind, out = tree_run
    run = open_run(out)  # deep: the tree_drafts values pass the validator
    nodes = run.scan("tree_drafts").collect()
    steps = run.scan("steps").collect()
    requests = run.scan("requests").collect()
    assert run.meta["tree"]["tree_nodes"] == nodes.height == steps["drafted"].cast(pl.Int64).sum()
    per = nodes.group_by("request", "step").agg(
        pl.len().alias("n"), (pl.col("label") == 1).sum().alias("on_path"),
        pl.col("depth").filter(pl.col("label") == 1).sort().alias("path_depths"))
    joined = steps.join(per, on=["request", "step"], how="left")
    assert (joined["n"] == joined["drafted"]).all()
    assert (joined["on_path"] == joined["accepted"]).all()
    # the accepted nodes of a step are one chain: depths 0, 1, ..., accepted - 1
    assert all(d.to_list() == list(range(a)) for d, a in zip(joined["path_depths"], joined["accepted"], strict=True))
    # a node is verified only when its parent is the root or accepted
    par = nodes.select("request", "step", pl.col("node").alias("parent"), pl.col("label").alias("parent_label"))
    verified = nodes.filter(pl.col("label").is_not_null()).join(par, on=["request", "step", "parent"], how="left")
    assert ((verified["parent"] == -1) | (verified["parent_label"] == 1)).all()
    emitted = steps.group_by("request").agg(pl.col("emitted").cast(pl.Int64).sum()).sort("request")
    assert emitted["emitted"].to_list() == requests.sort("request")["output_ids"].list.len().to_list()
    if kind.startswith("greedy"):
        assert nodes["match"].null_count() == 0
        assert (nodes.filter(pl.col("label") == 1)["match"] == 1).all()
        assert (nodes.filter(pl.col("label") == 0)["match"] == 0).all()
        assert nodes["accept_prob"].drop_nulls().is_in([0.0, 1.0]).all()
    else:
        assert nodes["match"].null_count() == nodes.height
        assert run.meta["tree"]["shape"].startswith("dynamic")
        assert steps["drafted"].max() <= 10
    assert run.meta["tree"]["accepted_per_step"] > 0.3  # the pair agrees often enough for trees to pay


def _damage(out, tmp_path, change) -> None:
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(out, bad)
    shard = sorted((bad / "tree_drafts").glob("*.parquet"))[0]
    change(pl.read_parquet(shard)).write_parquet(shard)
    reseal(bad)
    return bad


def _first_step_rows(frame: pl.DataFrame) -> pl.Expr:
    first = frame.sort("request", "step").row(0, named=True)
    return (pl.col("request") == first["request"]) & (pl.col("step") == first["step"])


@pytest.mark.parametrize("damage,words", [
    (lambda f: f.with_columns(pl.when(pl.col("node") == 1).then(pl.col("node")).otherwise(pl.col("parent"))
                              .alias("parent")), "a parent that is not an earlier node"),
    (lambda f: f.filter(~(_first_step_rows(f) & (pl.col("node") == 1))), "numbered 0, 1"),
    (lambda f: pl.concat([f, f.head(1)]), "numbered 0, 1"),
    (lambda f: f.with_columns(pl.when(pl.col("parent") >= 0).then(pl.col("depth") + 1).otherwise(pl.col("depth"))
                              .alias("depth")), "depth other than"),
    (lambda f: f.with_columns(pl.when(_first_step_rows(f) & (pl.col("depth") == 0)).then(pl.lit(1, pl.Int8))
                              .otherwise(pl.col("label")).alias("label")), "one accepted path"),
    (lambda f: f.with_columns(pl.col("label").fill_null(0)), "one accepted path"),
])
def test_tree_run_validator_catches_damaged_trees(tree_run, tmp_path, damage, words):
    _, out = tree_run
    with pytest.raises(SchemaError, match=words):
        open_run(_damage(out, tmp_path, damage))


@pytest.mark.parametrize("over,words", [
    ({"tree": {"widths": [2], "top_m": 2, "depth": 2, "nodes": 3}}, "either `widths`"),
    ({"tree": {"top_m": 2, "depth": 2}}, "either `widths`"),
    ({"tree": {"widths": [2, 0]}}, "tree.widths"),
    ({"tree": {"widths": [8, 8, 8, 8]}}, "at most 512 nodes"),
    ({"tree": {"top_m": 100, "depth": 2, "nodes": 10}}, "tree.top_m"),
    ({"tree": {"top_m": 2, "depth": 3, "nodes": 500}}, "at most the 10 nodes"),
    ({"tree": {"top_m": 2, "depth": 3, "nodes": 4, "proposals": "sampled"}}, "EAGLE-2"),
    ({"temperature": 0.0, "tree": {"widths": [2], "proposals": "sampled"}}, "greedy"),
    ({"batch_size": 4}, "batch_size"),
    ({"temperature": 0.0, "cache": {}}, "cache"),
    ({"tree": {"widths": [2], "proposals": "beam"}}, "top or sampled"),
])
def test_bad_tree_configs_are_refused(models_dir, over, words):
    with pytest.raises(ConfigError, match=words):
        _cfg(models_dir, **over)


def test_tree_outputs_match_the_chain_engine_under_greedy(tree_run, tmp_path, models_dir):
    """Greedy decoding is deterministic: the tree engine's outputs equal svt's chain engine's."""
    kind, out = tree_run
    if not kind.startswith("greedy"):
        pytest.skip("greedy only")
    chain = tmp_path / "chain"
    cfg = _cfg(models_dir, temperature=0.0, tree=None, k=3)
    collect(cfg, chain, progress=False)
    a = open_run(out).scan("requests").sort("request").collect()["output_ids"].to_list()
    b = open_run(chain).scan("requests").sort("request").collect()["output_ids"].to_list()
    assert a == b
    assert np.mean([len(x) for x in a]) == 24


def test_tree_resume_after_interrupt_equals_uninterrupted(models_dir, tmp_path, monkeypatch):
    """An interrupt while request 1's shards are being written keeps request 0; the resumed run
    holds exactly the rows of an uninterrupted one (sampling: each request has its own seed)."""
    import svt.traces.rundir as rundir_mod

    cfg = _cfg(models_dir, temperature=1.0, max_new_tokens=16)
    collect(cfg, tmp_path / "full", progress=False)
    real = rundir_mod.write_shard

    def flaky(run_dir, table, shard, frame):
        if shard == 1 and table == "tree_drafts":
            raise KeyboardInterrupt
        return real(run_dir, table, shard, frame)

    monkeypatch.setattr(rundir_mod, "write_shard", flaky)
    with pytest.raises(KeyboardInterrupt):
        collect(cfg, tmp_path / "part", progress=False)
    monkeypatch.setattr(rundir_mod, "write_shard", real)
    s = collect(cfg, tmp_path / "part", resume=True, progress=False)
    assert s.resumed_batches == 1
    for table, key in (("tree_drafts", ["request", "step", "node"]), ("steps", ["request", "step"]),
                       ("requests", ["request"])):
        a = open_run(tmp_path / "full").scan(table).collect().sort(key)
        b = open_run(tmp_path / "part").scan(table).collect().sort(key)
        keep = [c for c in a.columns if not c.endswith("_ms")]
        assert a.select(keep).equals(b.select(keep)), table
    assert open_run(tmp_path / "part").meta["tree"]["tree_nodes"] == open_run(tmp_path / "full").meta["tree"]["tree_nodes"]


def test_inspect_prints_a_tree_runs_nodes_by_depth(tree_run):
    from typer.testing import CliRunner

    from svt.cli import app

    _, out = tree_run
    r = CliRunner().invoke(app, ["inspect", str(out)])
    assert r.exit_code == 0, r.output
    assert "a tree run" in r.output and "tree nodes by depth" in r.output
    assert "no model drafts" not in r.output
