"""The built-in EAGLE-3 head through svt's collection surfaces: a run (run.json, hidden states, cache
drafts with the head as the model drafter), its cost profile, and clear refusals where a head cannot
go yet."""

import json

import numpy as np
import polars as pl
import pytest

from tests.conftest import ROOT

WORKLOADS = [str(ROOT / "data" / "workloads" / f"{w}.jsonl") for w in ("code", "prose")]


@pytest.fixture(scope="module")
def head_pair(models_dir):
    from svt.models import load_pair

    return load_pair(models_dir / "target", models_dir / "eagle3", device="cpu", dtype="float32")


def _cfg(models_dir, **extra):
    from svt.config import load_collect_config

    base = {"target": str(models_dir / "target"), "draft": str(models_dir / "eagle3"), "workloads": WORKLOADS,
            "requests": 4, "batch_size": 4, "max_new_tokens": 24, "k": 4, "device": "cpu", "temperature": 0.0}
    return load_collect_config(None, {**base, **extra})


def test_the_builtin_head_loads_as_a_hidden_state_drafter(head_pair):
    ident = head_pair.identity()
    assert head_pair.draft_kind == "eagle3"
    assert ident["draft"]["kind"] == "eagle3" and ident["draft"]["aux_layer_ids"] == [1, 2, 3]
    # the shared embedding is the target's, not counted as the head's
    emb = head_pair.target.get_input_embeddings().weight.numel()
    assert ident["draft"]["parameters"] == sum(p.numel() for p in head_pair.draft.parameters()) - emb
    assert head_pair.draft.embed_tokens is head_pair.target.get_input_embeddings()


def test_a_greedy_head_run_logs_the_heads_hidden_states_and_cache_drafts(models_dir, tmp_path):
    from svt.collect import collect
    from svt.traces.io import open_run

    cfg = _cfg(models_dir, log={"hidden": True}, cache=True)
    collect(cfg, tmp_path / "run", progress=False)
    meta = json.loads((tmp_path / "run" / "run.json").read_text())
    assert meta["drafter_kinds"] == ["eagle3", "cache"] and meta["models"]["draft"]["kind"] == "eagle3"
    run = open_run(tmp_path / "run")
    drafts = run.scan("drafts").collect()
    hidden = run.scan("hidden").collect()
    assert hidden.height == drafts.height
    assert len(hidden["hidden"][0]) == 256  # the head's width
    # the cache table's model yields are the head's own: at each step of the greedy run, the
    # teacher-forced accepted length equals the engine's
    cache = run.scan("cache_drafts").collect()
    steps = run.scan("steps").collect().sort("request", "step")
    for (r,), part in steps.group_by("request", maintain_order=True):
        pos = np.concatenate([[0], np.cumsum(part["emitted"].to_numpy())[:-1]])
        yields = cache.filter(pl.col("request") == r).sort("decode_pos")
        got = dict(zip(yields["decode_pos"].to_list(), yields["model_accepted"].to_list(), strict=True))
        n_out = int(part["emitted"].sum())
        for p, a in zip(pos, part["accepted"].to_list(), strict=True):
            left = n_out - p
            assert min(got[int(p)], left - 1) == min(a, left - 1)


def test_the_heads_cost_profile_times_its_drafts(head_pair):
    from svt.collect.profile import profile_pair

    table = profile_pair(head_pair.target, head_pair.draft, k=3, batches=(1, 4), context=32, repeats=2)
    assert sorted(table.draft_ms[4]) == [1, 2, 3] and table.draft_ms[4][3] > table.draft_ms[4][1] > 0


def test_a_tree_run_grows_the_heads_trees(models_dir, tmp_path):
    """The built-in head through the tree engine (EAGLE-2 growth), greedy: the outputs are the
    target's greedy outputs (the chain run's), and run.json names the head's kind and attention."""
    from svt.collect import collect
    from svt.traces.io import open_run

    collect(_cfg(models_dir, requests=2, batch_size=1), tmp_path / "chain", progress=False)
    tree = {"top_m": 3, "depth": 4, "nodes": 10}
    collect(_cfg(models_dir, requests=2, batch_size=1, tree=tree), tmp_path / "tree", progress=False)
    meta = json.loads((tmp_path / "tree" / "run.json").read_text())
    assert meta["drafter_kinds"] == ["eagle3"] and "hidden-state head" in meta["tree"]["attention"]["draft"]
    outs = [open_run(tmp_path / r).scan("requests").sort("request").collect()["output_ids"].to_list()
            for r in ("chain", "tree")]
    assert outs[0] == outs[1]
    assert meta["tree"]["accepted_per_step"] > 1.5  # the trained head's trees are accepted most of the time


def test_a_reference_run_takes_a_head_over_its_target(models_dir, tmp_path):
    """Once refused ("a reference run computes no hidden states"): the target now runs
    teacher-forced over the reference and feeds the head (tests/collect/test_reference_run.py holds
    it equal to live greedy decoding)."""
    from svt.collect import collect
    from svt.traces.io import read_meta

    cfg = _cfg(models_dir, engine="reference", temperature=0.0)
    collect(cfg, tmp_path / "run", progress=False)
    drafter = read_meta(tmp_path / "run")["drafter"]
    assert drafter["kind"] == "head" and drafter["target"]["path"] == str((models_dir / "target").resolve())
