"""The tree engine: svt's engine with a draft tree per step (the config's ``tree:`` section), one
request at a time (one shard per request, resumable). Writes ``tree_drafts`` (one row per node),
``steps`` (``drafted``: the tree's nodes; ``accepted``: the accepted path's length), ``requests``
and an empty ``drafts`` table (a tree run has no chain drafts)."""

from __future__ import annotations

import time
from pathlib import Path

import polars as pl

from svt.collect.engines import CollectOptions, Engine
from svt.collect.plan import CollectPlan, batch_seed
from svt.collect.runner import request_shards, run_plan
from svt.collect.tree_decode import TreeLog, TreeShape, decode_tree, tree_attention
from svt.config import CollectConfig, TreeConfig
from svt.errors import SchemaError
from svt.traces.io import open_run, read_meta, write_meta
from svt.traces.rundir import RunSummary, commit_batch, completed_batches, finish_run
from svt.traces.schema import TABLES

ATTENTION = {"mask": "one forward per tree with a 4D tree attention mask",
             "paths": "one chain forward per root-to-leaf path (the model's attention takes no tree mask; same "
                      "distributions)",
             "paths-chosen": "one chain forward per root-to-leaf path (chosen by the config's `tree.attention: paths`; "
                             "same distributions as a tree mask)",
             "head": "a hidden-state head: one forward per tree level, each node a slot that reads its parent's "
                     "output feature and attends to the verified prefix and its ancestors (EAGLE-2/3 growth)"}
VERIFY = {"greedy": "greedy: the deepest path whose every token is the target's argmax",
          "sampling": "multi-candidate speculative sampling (SpecInfer): siblings in rank order against "
                      "the residual; lossless"}


class TreeEngine(Engine):
    """svt's engine growing and verifying draft trees."""

    name = "tree"
    resumable = True

    def collect(self, cfg: CollectConfig, out: Path, options: CollectOptions) -> RunSummary:
        return run_plan(cfg, out, options, collect_trees)


def tree_shape(tree: TreeConfig) -> TreeShape:
    if tree.widths is not None:
        return TreeShape(widths=tuple(tree.widths), proposals=tree.proposals)
    return TreeShape(top_m=tree.top_m, depth=tree.depth, nodes=tree.nodes)


def _attention(model, wanted: str) -> str:
    """How ``model`` scores a tree, in words: a chosen ``paths`` is not a model without tree masks."""
    how = tree_attention(model, wanted)
    return ATTENTION["paths-chosen" if how == "paths" and wanted == "paths" else how]


def _tree_meta(plan: CollectPlan) -> dict:
    cfg, tree = plan.cfg, plan.cfg.tree
    greedy = cfg.temperature == 0
    meta = plan.new_meta()
    meta.update({
        "status": "running", "models": plan.pair.identity(),
        "sampling": {"temperature": cfg.temperature, "top_p": cfg.top_p, "greedy": greedy,
                     "features_from": "unscaled softmax (T=1); greedy acceptance = argmax agreement"
                     if greedy else "processed distributions (temperature, top-p)"},
        "k": cfg.k, "drafter_kinds": [plan.pair.draft_kind], "av": None,
        "tree": {"shape": "static" if tree.widths is not None else "dynamic (EAGLE-2)",
                 "widths": tree.widths, "top_m": tree.top_m, "depth": tree.max_depth, "nodes": tree.size(),
                 "proposals": tree.proposals, "verify": VERIFY["greedy" if greedy else "sampling"],
                 "attention": {"target": _attention(plan.pair.target, tree.attention),
                               "draft": _attention(plan.pair.draft, tree.attention)
                               if plan.pair.draft_kind == "model" else ATTENTION["head"]},
                 "note": "one request at a time; steps.drafted is the tree's size, steps.accepted the accepted "
                         "path's length"},
        "workloads": plan.workloads.files, "workload_sha256": plan.workloads.hashes,
        "workload_reading": plan.workloads.reading,
        "seed": cfg.seed, "device": str(plan.pair.device), "environment": plan.environment(),
        "batches": len(plan.ids),
    })
    return meta


def _request_frames(plan: CollectPlan, r: int, log: TreeLog) -> dict[str, pl.DataFrame]:
    workload = plan.workload_of[r]
    nodes = pl.DataFrame(log.nodes).with_columns(
        pl.lit(workload).alias("workload"),
        pl.col("accept_prob").fill_nan(None),
        pl.col("label").replace(-1, None),
        pl.col("match").replace(-1, None),
    )
    steps = pl.DataFrame(log.steps).with_columns(pl.lit(1).alias("batch_size"), pl.col("drafted").alias("kept"),
                                                 pl.lit(True).alias("explored"))
    frames = {"drafts": pl.DataFrame(schema=TABLES["drafts"].columns), "steps": steps, "tree_drafts": nodes}
    return {**frames, **request_shards(plan, r, log.output, log.finish)}


def collect_trees(plan: CollectPlan) -> RunSummary:
    """The tree engine's body: every request not yet complete, decoded and committed in order."""
    cfg, pair, out = plan.cfg, plan.pair, plan.out
    shape = tree_shape(cfg.tree)
    attention = tuple(tree_attention(m, cfg.tree.attention) for m in (pair.target, pair.draft))
    done = completed_batches(out, plan.old_meta)
    meta = _tree_meta(plan)
    write_meta(out, meta)
    t_start = time.time()
    for r in range(len(plan.ids)):
        if r in done:
            continue
        log = decode_tree(pair.target, pair.draft, list(plan.ids[r]), shape, temperature=cfg.temperature,
                          top_p=cfg.top_p, max_new_tokens=cfg.max_new_tokens, eos_id=pair.tokenizer.eos_token_id,
                          seed=batch_seed(cfg.seed, r), request=r, attention=attention)
        commit_batch(out, meta, r, _request_frames(plan, r, log))
    summary = finish_run(out, meta, time.time() - t_start, resumed=len(done))
    _record_trees(out)
    return summary


def _record_trees(out: Path) -> None:
    """run.json's tree totals: steps, nodes, accepted tokens per step and per verified node."""
    run = open_run(out, deep=False)
    st = run.scan("steps").select(pl.len(), pl.col("drafted").cast(pl.Int64).sum(),
                                  pl.col("accepted").cast(pl.Int64).sum(),
                                  pl.col("emitted").cast(pl.Int64).sum()).collect().row(0)
    nodes = run.scan("tree_drafts").select(pl.len()).collect().item()
    if nodes != st[1]:
        raise SchemaError(f"{out}: steps record {st[1]} tree nodes but tree_drafts holds {nodes} rows.")
    meta = read_meta(out)
    meta["tree"].update({"steps": st[0], "tree_nodes": st[1], "accepted": st[2], "tokens": st[3],
                         "accepted_per_step": st[2] / max(st[0], 1), "accepted_per_node": st[2] / max(st[1], 1)})
    meta["counts"]["tree_drafts"] = nodes
    write_meta(out, meta)
