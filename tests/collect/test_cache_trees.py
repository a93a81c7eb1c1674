"""SuffixDecoding tree drafts (``cache: {tree: true}``): labels by greedy verification, the
``cache_trees`` table and its cross-checks, and the tree half of the HVD report."""

from __future__ import annotations

import shutil

import numpy as np
import polars as pl
import pytest

from svt.collect.cache import CacheDrafter
from svt.collect.cache_run import cache_rows_for_batch
from svt.config import CacheOptions
from svt.errors import ConfigError, DataError, SchemaError
from svt.features.char_classes import char_class_table
from svt.traces.io import open_run
from svt.trees.verify import oracle_tree_labels

from ..conftest import reseal


def _walk_labels(parent, token, cont):
    """arctic-inference's simulator walk (children in order, the first matching one accepted),
    turned into per-node labels."""
    accepted, node = set(), -1
    for tok in cont:
        kids = [i for i, p in enumerate(parent) if p == node]
        hit = next((c for c in kids if token[c] == tok), None)
        if hit is None:
            break
        accepted.add(hit)
        node = hit
    depth = [0] * len(parent)
    for i, p in enumerate(parent):
        depth[i] = 0 if p < 0 else depth[p] + 1
    out = []
    for i, p in enumerate(parent):
        if i in accepted:
            out.append(1)
        elif (p < 0 or p in accepted) and depth[i] < len(cont):
            out.append(0)
        else:
            out.append(-1)
    return out


def test_labels_follow_arctic_inferences_verification_walk():
    rng = np.random.default_rng(0)
    for _ in range(400):
        n = int(rng.integers(0, 12))
        parent = [int(rng.integers(-1, i)) if i else -1 for i in range(n)]
        token = rng.integers(0, 3, size=n)  # few tokens: siblings repeat and paths match often
        cont = rng.integers(0, 3, size=int(rng.integers(0, 6)))
        got = oracle_tree_labels(np.array(parent, dtype=np.int64), token, cont)
        assert got.tolist() == _walk_labels(parent, token.tolist(), cont.tolist()), (parent, token, cont)


class _Tok:
    def decode(self, ids):
        return "x"


@pytest.mark.parametrize("tree", [False, True])
def test_one_request_replays_arctic_inferences_own_simulator(tree, monkeypatch):
    """One request on a fresh cache: walking svt's rows cache-only (advance by yield + 1) accepts,
    cycle by cycle, what arctic-inference's ``suffix_decode`` accepts with the same options."""
    import importlib.util
    import sys
    import types

    from arctic_inference.suffix_decoding import SuffixDecodingCache

    if importlib.util.find_spec("pandas") is None:
        # the simulator module imports pandas for its dataset helpers (annotations only in
        # suffix_decode); svt does not depend on it
        monkeypatch.setitem(sys.modules, "pandas", types.SimpleNamespace(DataFrame=object))
    monkeypatch.delitem(sys.modules, "arctic_inference.suffix_decoding.simulator", raising=False)
    from arctic_inference.suffix_decoding.simulator import suffix_decode

    rng = np.random.default_rng(3)
    motifs = [rng.integers(0, 30, size=6) for _ in range(4)]
    prompt = np.concatenate([motifs[i] for i in rng.integers(0, 4, size=8)]).astype(np.int64)
    output = np.concatenate([motifs[i] for i in rng.integers(0, 4, size=10)] + [rng.integers(0, 30, size=5)])
    opts = CacheOptions(max_tree_depth=24, max_draft_len=8, max_spec_factor=2.0, min_token_prob=0.05, tree=tree)
    trees: list[dict] = []
    rows = cache_rows_for_batch(CacheDrafter(opts), opts, char_class_table(_Tok(), 40),
                                pl.DataFrame({"request": [0], "workload": ["w"], "prompt_ids": [prompt.tolist()],
                                              "output_ids": [output.tolist()]}),
                                pl.DataFrame({"request": [0] * output.size, "step": list(range(output.size)),
                                              "emitted": [1] * output.size}), trees if tree else None)
    if tree:
        nodes = pl.DataFrame(trees)
        y = np.zeros(output.size, dtype=np.int64)
        for (t,), part in nodes.group_by("decode_pos"):
            y[t] = int((part["label"] == 1).sum())
    else:
        assert trees == []
        y = np.array([r["oracle_accepted"] for r in rows])
    ours, t = [], 0
    while t < output.size:
        ours.append(int(y[t]))
        t += int(y[t]) + 1
    ref = suffix_decode(SuffixDecodingCache(24, max_cached_requests=0), 0, prompt.astype(np.int32),
                        output.astype(np.int32), max_spec_tokens=8, max_spec_factor=2.0, min_token_prob=0.05,
                        use_tree_spec=tree, use_cached_prompt=True)
    assert ours == [r["num_accept_toks"] for r in ref]
    assert sum(ours) > 10  # the request copies: the comparison is not between empty drafts


def test_tree_option_is_checked():
    from svt.config import load_collect_config

    base = {"target": "t", "draft": "d", "workloads": ["code"], "temperature": 0}
    with pytest.raises(ConfigError, match="cache.tree"):
        load_collect_config(None, base={**base, "cache": {"tree": "yes"}})
    with pytest.raises(ConfigError, match="cache.tree"):
        load_collect_config(None, base={**base, "batch_size": 1, "cache": {"tree": True},
                                        "hvd": {"fit": "f.json", "tau": 2.0}})


def test_the_greedy_run_holds_labelled_trees(greedy_run):
    from svt.fit.yield_data import load_cache_drafts_for_fit, load_cache_trees

    run = open_run(greedy_run)
    assert run.meta["cache"]["trees"]["nodes"] == run.meta["counts"]["cache_trees"] > 0
    rows, _ = load_cache_drafts_for_fit([greedy_run], with_empty=True)
    nodes = load_cache_trees([greedy_run], rows)
    assert nodes.height == run.meta["counts"]["cache_trees"]
    assert (nodes["label"] == 1).sum() > 0 and (nodes["label"] == 0).sum() > 0


def _copy(greedy_run, tmp_path):
    run = tmp_path / "r"
    shutil.copytree(greedy_run, run)
    return run, sorted((run / "cache_trees").glob("part-*.parquet"))[0]


@pytest.mark.parametrize(("edit", "error", "match"), [
    # a rejected node called accepted (the structure still one path): the output disagrees
    (lambda d: d.with_columns(pl.when((pl.col("label") == 0) & (pl.col("parent") < 0)).then(1).otherwise(
        pl.col("label")).cast(pl.Int8).alias("label")), SchemaError, "label"),
    (lambda d: d.with_columns(pl.when(pl.col("label") == 1).then(None).otherwise(pl.col("label"))
                              .cast(pl.Int8).alias("label")), SchemaError, "one accepted path"),
    (lambda d: d.filter(pl.col("node") != 1), SchemaError, "numbered"),
    (lambda d: d.with_columns(pl.col("score") + pl.col("node").cast(pl.Float32)), DataError, "per-tree"),
    (lambda d: d.with_columns((pl.col("decode_pos") + 10_000).cast(pl.Int32)), DataError, "no row"),
])
def test_damaged_trees_are_refused(greedy_run, tmp_path, edit, error, match):
    from svt.fit.yield_data import load_cache_drafts_for_fit, load_cache_trees

    run, shard = _copy(greedy_run, tmp_path)
    d = pl.read_parquet(shard)
    assert not edit(d).equals(d)
    edit(d).write_parquet(shard)
    reseal(run)
    with pytest.raises(error, match=match):
        rows, _ = load_cache_drafts_for_fit([run], with_empty=True)
        load_cache_trees([run], rows)


def test_tree_labels_that_disagree_with_the_output_are_refused(greedy_run, tmp_path):
    """A consistent-looking tree whose accepted path is not the output's: only the cross-check
    with the requests table can see it."""
    from svt.fit.yield_data import load_cache_drafts_for_fit, load_cache_trees

    run, shard = _copy(greedy_run, tmp_path)
    d = pl.read_parquet(shard)
    hit = d.filter(pl.col("label") == 1).row(0, named=True)
    d = d.with_columns(pl.when((pl.col("request") == hit["request"]) & (pl.col("decode_pos") == hit["decode_pos"])
                               & (pl.col("node") == hit["node"])).then(pl.col("token") + 1)
                       .otherwise(pl.col("token")).alias("token"))
    d.write_parquet(shard)
    reseal(run)
    rows, _ = load_cache_drafts_for_fit([run], with_empty=True)
    with pytest.raises(DataError, match="greedy verification"):
        load_cache_trees([run], rows)


def test_report_figures_by_hand(greedy_run, tmp_path):
    from sklearn.metrics import roc_auc_score

    from svt.fit.yield_data import load_cache_drafts_for_fit, load_cache_trees
    from svt.report.cache_trees import cache_tree_report
    from svt.simulate.cost_files import load_costs

    rows, _ = load_cache_drafts_for_fit([greedy_run], with_empty=True)
    costs = load_costs("configs/costs/h100-llama8b-eagle.yaml")
    k = open_run(greedy_run).meta["k"]
    out = cache_tree_report([greedy_run], rows, k, costs, 10)
    nodes = load_cache_trees([greedy_run], rows).filter(~pl.col("beyond"))
    cal = out["cache_tree"]["calibration"]["all"]
    assert cal["auc"] == pytest.approx(roc_auc_score((nodes["label"] == 1).fill_null(False), nodes["prob"]))
    opp = out["cache_tree"]["opportunity"]["all"]
    per = nodes.group_by("request", "decode_pos").agg((pl.col("label") == 1).sum().alias("y"))
    assert opp["mean_tree_yield"] == pytest.approx(per["y"].sum() / rows.height)
    # cache-only tree by hand: walk each request from 0 by tree yield + 1
    y = dict(((r, t), v) for r, t, v in per.iter_rows())
    cycles = 0
    for (req,), part in rows.group_by("request"):
        t, n = 0, part.height
        while t < n:
            cycles += 1
            t += y.get((req, t), 0) + 1
    row = next(r for r in out["hvd_tree"]["rows"] if r["group"] == "all" and r["policy"] == "cache-only tree")
    assert row["cycles"] == cycles


def test_redo_without_trees_drops_them(greedy_run, tmp_path):
    from svt.collect.cache_run import build_cache_drafts
    from svt.fit.yield_data import load_cache_drafts_for_fit

    run, _ = _copy(greedy_run, tmp_path)
    meta = open_run(run).meta
    m = meta["cache"]

    def model_yields(part):
        got = pl.read_parquet(run / "cache_drafts").sort("request", "decode_pos")
        return [got.filter(pl.col("request") == r)["model_accepted"].to_numpy() for r in part["request"]]

    from svt.models.loading import load_tokenizer

    opts = CacheOptions(**{**m["options"], "tree": False})
    build_cache_drafts(run, opts, None, load_tokenizer(meta["models"]["target"]["path"]), model_yields=model_yields)
    after = open_run(run)
    assert not after.has("cache_trees") and "cache_trees" not in after.meta["counts"]
    assert "trees" not in after.meta["cache"]
    load_cache_drafts_for_fit([run])
    from svt.fit import fit_runs
    from svt.report import EvaluateOptions, evaluate

    tree_fit = tmp_path / "t.json"
    fit_runs([greedy_run], "tree-yield-linear").save(tree_fit)
    with pytest.raises(DataError, match="does not have"):
        evaluate([run], EvaluateOptions(fits=[str(tree_fit)]))
