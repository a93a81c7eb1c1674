"""`svt evaluate` on tree runs: acceptance by depth adds up, the calibration metrics agree with
scikit-learn, the replay of the logged shape reproduces what the run realised, and the end-to-end
rows follow the cost table."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from sklearn.metrics import roc_auc_score

from svt.collect import collect
from svt.config import load_collect_config
from svt.errors import DataError, SchemaError
from svt.report import EvaluateOptions, evaluate
from svt.report.trees_text import tree_markdown
from svt.simulate.cost_files import load_costs
from svt.traces.io import open_run
from tests.conftest import ROOT

COSTS = ROOT / "configs" / "costs" / "h100-llama8b-eagle.yaml"


def _collect(models_dir, out, **over):
    base = {"target": str(models_dir / "target"), "draft": str(models_dir / "draft-large"),
            "workloads": [str(ROOT / "data" / "workloads" / f"{w}.jsonl") for w in ("code", "structured")],
            "requests": 6, "batch_size": 1, "max_new_tokens": 32, "device": "cpu", "max_prompt_tokens": 128,
            "temperature": 0.0, "tree": {"widths": [3, 2, 1]}}
    base.update(over)
    collect(load_collect_config(None, base=base), out, progress=False)
    return out


@pytest.fixture(scope="module")
def greedy_trees(tmp_path_factory, models_dir):
    return _collect(models_dir, tmp_path_factory.mktemp("trees") / "greedy")


def test_tree_report_adds_up_and_agrees_with_sklearn(greedy_trees):
    report = evaluate([greedy_trees], EvaluateOptions(costs=str(COSTS)))
    assert report["kind"] == "trees"
    t = report["trees"]
    run = open_run(greedy_trees)
    nodes = run.scan("tree_drafts").collect()
    steps = run.scan("steps").collect()
    assert sum(r["nodes"] for r in t["by_depth"]) == nodes.height
    assert sum(r["accepted"] for r in t["by_depth"]) == steps["accepted"].cast(pl.Int64).sum()
    # the conditional rate per depth: accepted among the verified nodes of the depth, not among all
    for r in t["by_depth"]:
        at = nodes.filter(pl.col("depth") == r["depth"])
        verified = at.filter(pl.col("label").is_not_null())
        assert r["verified"] == verified.height
        assert r["conditional"] == pytest.approx((verified["label"] == 1).sum() / verified.height)
    assert any(r["nodes"] > r["verified"] > 0 for r in t["by_depth"])  # a depth where the two differ
    tried = nodes.filter(pl.col("label").is_not_null())
    row = next(c for c in t["calibration"] if c["predictor"] == "q_token" and c["label"] == "accepted given tried")
    assert row["n"] == tried.height
    assert row["auc"] == pytest.approx(roc_auc_score(tried["label"], tried["q_token"]), abs=1e-12)
    path = next(c for c in t["calibration"] if c["predictor"] == "path_prob")
    on_path = (nodes["label"] == 1).fill_null(False)
    assert path["label"] == "on the accepted path" and path["n"] == nodes.height
    assert path["rate"] == pytest.approx(on_path.mean())
    assert path["auc"] == pytest.approx(roc_auc_score(on_path, nodes["path_prob"]), abs=1e-12)
    match = next(c for c in t["calibration"] if c["predictor"] == "q_token" and c["label"].startswith("match"))
    assert match["auc"] == pytest.approx(roc_auc_score(nodes["match"], nodes["q_token"]), abs=1e-12)
    # the logged shape replayed is the run itself
    rows = {(r["policy"], r["budget"]): r for r in t["replay"]}
    realised = steps["accepted"].cast(pl.Float64).mean()
    assert rows[("static", "widths=3,2,1")]["accepted_per_step"] == pytest.approx(realised)
    assert rows[("static", "widths=3,2,1")]["nodes_per_step"] == pytest.approx(3 + 6 + 6)
    full = max((r for r in t["replay"] if r["policy"] == "path-prob"), key=lambda r: r["nodes_per_step"])
    assert full["accepted_per_step"] == pytest.approx(realised)
    # the oracle bounds every policy of the same budget; the chain K=1 is the rank-0 child alone
    for r in t["replay"]:
        if r["policy"] in ("path-prob", "predictor"):
            assert rows[("oracle", r["budget"])]["accepted_per_step"] >= r["accepted_per_step"] - 1e-12
    assert rows[("chain", "K=1")]["nodes_per_step"] == 1.0
    assert rows[("chain", "K=1")]["accepted_per_step"] == pytest.approx(
        nodes.filter((pl.col("depth") == 0) & (pl.col("rank") == 0))["match"].cast(pl.Float64).mean())
    # end to end: each row's time is the cost table's
    costs = load_costs(COSTS)
    e2e = t["end_to_end"]
    assert len(e2e) == len(t["replay"]) * 7
    for r in e2e:
        shape = rows[(r["policy"], r["budget"])]
        b = r["concurrency"]
        assert r["verify_ms"] == pytest.approx(float(costs.verify(np.array([b * (1 + shape["nodes_per_step"])]))[0]))
        assert r["throughput"] == pytest.approx(r["interactivity"] * b)
        assert r["interactivity"] == pytest.approx(shape["tokens_per_step"] * 1e3 / (r["draft_ms"] + r["verify_ms"]))
    for r in (r for r in e2e if (r["policy"], r["budget"]) == ("chain", "K=1")):
        assert r["draft_ms"] == pytest.approx(costs.draft(r["concurrency"], 1))  # one pass: the pending token
    k2 = [r for r in e2e if (r["policy"], r["budget"]) == ("chain", "K=2") and r["concurrency"] == 1][0]
    assert k2["draft_ms"] > costs.draft(1, 1)  # and one more where the rank-0 child was expanded
    assert any(r["pareto"] for r in e2e) and not any(r["pareto"] for r in e2e if r["policy"] == "oracle")
    md = tree_markdown(report)
    for block in md.split("\n\n"):  # every markdown table keeps its header's column count
        rows = [ln for ln in block.splitlines() if ln.startswith("|")]
        assert len({ln.count("|") for ln in rows}) <= 1, block
    for heading in ("Acceptance by depth", "Calibration", "Expected accepted length", "Tree policies", "End to end"):
        assert heading in md


def test_sampling_tree_report_has_no_replay(tmp_path, models_dir):
    run = _collect(models_dir, tmp_path / "sampled", requests=2, max_new_tokens=16, temperature=1.0,
                   tree={"widths": [2, 2], "proposals": "sampled"})
    report = evaluate([run], EvaluateOptions())
    assert report["trees"]["replay"] is None and report["trees"]["end_to_end"] is None
    assert "temperature: 0" in tree_markdown(report)
    with pytest.raises(DataError, match="sampling run"):  # a cost table it cannot use is refused, not dropped
        evaluate([run], EvaluateOptions(costs=str(COSTS)))
    with pytest.raises(DataError, match="--bootstrap"):
        evaluate([run], EvaluateOptions(bootstrap=5))


def test_one_request_has_no_cross_fitted_predictor(tmp_path, models_dir):
    run = _collect(models_dir, tmp_path / "one", requests=1, max_new_tokens=12)
    t = evaluate([run], EvaluateOptions())["trees"]
    assert "at least 2 requests" in t["predictor_note"]
    assert not any(c["predictor"].startswith("predictor") for c in t["calibration"])
    assert not any(r["policy"] == "predictor" for r in t["replay"])


def test_a_cost_table_that_does_not_cover_the_replay_is_flagged(greedy_trees, tmp_path):
    import yaml

    table = yaml.safe_load(COSTS.parent.joinpath("h100-llama8b-eagle.yaml").read_text())
    small = {"kind": "measured", "drafter": "autoregressive", "description": "cut",
             "draft_ms": {1: {1: 1.0, 2: 2.0}, 2: {1: 1.5, 2: 3.0}}, "verify_ms": {1: 2.0, 2: 2.5}}
    assert table["kind"] == "roofline"
    (tmp_path / "small.yaml").write_text(yaml.safe_dump(small))
    t = evaluate([greedy_trees], EvaluateOptions(costs=str(tmp_path / "small.yaml")))["trees"]
    assert any("verify_ms up to 2 tokens" in w for w in t["costs"]["beyond_table"])
    assert "does not cover" in tree_markdown({"trees": t, "svt_version": "x", "created": "y",
                                              "settings": {"n_bins": 10}})
    full = evaluate([greedy_trees], EvaluateOptions(costs=str(COSTS)))["trees"]
    assert full["costs"]["beyond_table"] == []  # a roofline model covers any size
    assert "unreliable" not in tree_markdown({"trees": t, "svt_version": "x", "created": "y",
                                              "settings": {"n_bins": 10}})


def test_a_tree_replay_on_a_flagged_cost_table_says_so(greedy_trees, tmp_path):
    """As the chain replay does: the report, its text and its console table name a cost profile
    made on a busy machine."""
    import yaml

    from svt.report.trees_text import tree_console

    small = {"kind": "measured", "drafter": "autoregressive", "description": "busy",
             "draft_ms": {1: {1: 1.0, 2: 2.0}, 2: {1: 1.5, 2: 3.0}}, "verify_ms": {1: 2.0, 2: 2.5},
             "measurement": {"warnings": ["the machine's load (3.7) was above its 2 cores"]}}
    (tmp_path / "busy.yaml").write_text(yaml.safe_dump(small))
    report = {"trees": evaluate([greedy_trees], EvaluateOptions(costs=str(tmp_path / "busy.yaml")))["trees"],
              "svt_version": "x", "created": "y", "settings": {"n_bins": 10}}
    assert report["trees"]["costs"]["warnings"] == ["the machine's load (3.7) was above its 2 cores"]
    assert "**The cost table is unreliable** (the machine's load (3.7)" in tree_markdown(report)
    assert any("UNRELIABLE" in str(t.title) for t in tree_console(report))


def test_nodes_and_steps_must_agree(greedy_trees, tmp_path):
    import shutil

    from tests.conftest import reseal

    bad = tmp_path / "bad"
    shutil.copytree(greedy_trees, bad)
    shard = sorted((bad / "steps").glob("*.parquet"))[0]
    frame = pl.read_parquet(shard)
    frame.with_columns(*(pl.when(pl.col("step") == 0).then(pl.col(c) + 1).otherwise(pl.col(c)).alias(c)
                         for c in ("drafted", "kept"))).write_parquet(shard)
    reseal(bad)
    with pytest.raises(SchemaError, match="tree_drafts and steps tables disagree: .* tree nodes other than"):
        evaluate([bad], EvaluateOptions())


def test_tree_runs_are_evaluated_alone(greedy_trees, small_run, tmp_path):
    with pytest.raises(DataError, match="beside chain runs"):
        evaluate([greedy_trees, small_run], EvaluateOptions())
    with pytest.raises(DataError, match="--by"):
        evaluate([greedy_trees], EvaluateOptions(by="workload"))


def test_tree_figures_draw_the_stored_rows(greedy_trees, small_run, tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    from svt.plots import get_plot, plot_all
    from svt.report import write_report

    report = evaluate([greedy_trees], EvaluateOptions())
    write_report(report, tmp_path / "rep")
    written = plot_all(tmp_path / "rep")
    assert sorted(p.name for p in written) == ["tree-budget.png", "tree-calibration.png"]
    fig = get_plot("tree-budget")(report)
    lines = {ln.get_label(): ln for ln in fig.axes[0].get_lines()}
    chain = sorted((r for r in report["trees"]["replay"] if r["policy"] == "chain"), key=lambda r: r["nodes_per_step"])
    np.testing.assert_allclose(lines["chain"].get_ydata(), [r["accepted_per_step"] for r in chain])
    with pytest.raises(DataError, match="tree run"):
        get_plot("roc")(report)
    chain_report = evaluate([small_run], EvaluateOptions())
    with pytest.raises(DataError, match="tree run's report"):
        get_plot("tree-budget")(chain_report)


def test_the_feature_zoo_reads_tree_nodes(greedy_trees):
    report = evaluate([greedy_trees], EvaluateOptions())
    zoo = report["trees"]["features"]
    nodes = open_run(greedy_trees).scan("tree_drafts").collect()
    rows = {(r["feature"], r["label"]): r for r in zoo["rows"]}
    q = rows[("q_sampled", "match (every node)")]
    assert q["n"] == nodes.height
    assert q["auc"] == pytest.approx(roc_auc_score(nodes["match"], nodes["q_token"]), abs=1e-12)
    rank = rows[("rank", "match (every node)")]  # a lower rank is tried first: direction -1
    assert rank["auc"] == pytest.approx(roc_auc_score(nodes["match"], -nodes["rank"].cast(pl.Float64)), abs=1e-12)
    tried = nodes.filter(pl.col("label").is_not_null())
    ent = rows[("entropy", "accepted given tried")]
    assert ent["auc"] == pytest.approx(roc_auc_score(tried["label"], -tried["q_entropy"]), abs=1e-12)
    d1 = next(d for d in ent["by_depth"] if d["depth"] == 1)
    t1 = tried.filter(pl.col("depth") == 1)
    assert d1["n"] == t1.height
    assert "margin" in zoo["skipped"] and "q_margin" in zoo["skipped"]["margin"]
    assert "feature zoo on tree nodes" in tree_markdown(report)
