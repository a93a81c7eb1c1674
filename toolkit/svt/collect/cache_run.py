"""The ``cache_drafts`` table of a greedy run: SuffixDecoding replayed over the run's requests in
the order the collector served them, with each row's oracle yield and the model drafter's accepted
length at the same position.

Timing follows the collector: batches run one after another; inside a batch every request is
active from the start, and a request's response enters the global tree after its last step, so a
position decided at engine step s sees exactly the responses that finished at steps before s.
Used by ``svt collect`` (config key ``cache``) and by ``svt cache RUN`` on an existing run.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import polars as pl

from svt.collect.cache import (
    ROW_COLUMNS,
    CacheDrafter,
    CacheTree,
    RequestFeatures,
    teacher_forced_accepted,
)
from svt.config import CacheOptions
from svt.errors import ConfigError, DataError
from svt.features.char_classes import char_class_table
from svt.metrics.repetition import common_prefix
from svt.traces.io import (
    forget_shards,
    list_shards,
    open_run,
    read_meta,
    record_shards,
    write_meta,
    write_shard,
)
from svt.traces.rundir import swap_table
from svt.traces.schema import get_table
from svt.trees.verify import oracle_tree_labels


def _positions_to_steps(steps: pl.DataFrame, n_out: int) -> np.ndarray:
    """The engine step that emitted each output token of one request."""
    st = steps.sort("step")
    ends = np.cumsum(st["emitted"].to_numpy())
    if ends.size == 0 or ends[-1] != n_out:
        raise DataError(f"The steps of request {steps['request'][0] if steps.height else '?'} emitted "
                        f"{int(ends[-1]) if ends.size else 0} tokens but its output has {n_out}.")
    return st["step"].to_numpy()[np.searchsorted(ends, np.arange(n_out), side="right")]


def cache_rows_for_batch(drafter: CacheDrafter, options: CacheOptions, classes: np.ndarray,
                         reqs: pl.DataFrame, steps: pl.DataFrame, trees: list[dict] | None = None) -> list[dict]:
    """Rows of one batch's requests (``reqs``: request, workload, prompt_ids, output_ids), feeding
    ``drafter`` in server order; the batch's responses are in the global tree afterwards. With
    ``trees`` (a list), the tree draft proposed at each position from the same state is appended
    to it, one row per node (``cache_trees``)."""
    info = []
    for r in reqs.iter_rows(named=True):
        prompt = np.asarray(r["prompt_ids"], dtype=np.int64)
        output = np.asarray(r["output_ids"], dtype=np.int64)
        s_of = _positions_to_steps(steps.filter(pl.col("request") == r["request"]), output.size)
        finish = int(s_of.max()) if s_of.size else -1
        info.append((r, prompt, output, s_of, finish, RequestFeatures(options, classes, prompt.size)))
        drafter.start(r["request"], prompt)
    rows: list[dict] = []
    pending = sorted(range(len(info)), key=lambda i: (info[i][4], info[i][0]["request"]))
    all_steps = np.unique(np.concatenate([x[3] for x in info])) if info else []
    next_pos = [0] * len(info)
    for s in all_steps:
        while pending and info[pending[0]][4] < s:  # responses finished before step s
            i = pending.pop(0)
            drafter.finish(info[i][0]["request"], info[i][2])
        for i, (r, prompt, output, s_of, _, feats) in enumerate(info):
            # s_of is non-decreasing: this request's positions emitted at step s start at next_pos[i]
            lo = next_pos[i]
            hi = lo
            while hi < s_of.size and s_of[hi] == s:
                hi += 1
            next_pos[i] = hi
            for t in range(lo, hi):
                context = np.concatenate([prompt, output[:t]])
                draft, probs, score, match_len, glob, ms = drafter.propose(r["request"], context)
                row = feats.row(int(t), output[:t], context, draft, probs, score, match_len, glob)
                row.update(request=r["request"], workload=r["workload"], decode_pos=int(t),
                           draft_ids=draft.tolist(), lookup_ms=ms,
                           oracle_accepted=common_prefix(draft, output[t:]))
                rows.append(row)
                if trees is not None:
                    trees.extend(tree_rows(drafter.propose_tree(r["request"], context), output[t:],
                                           r["request"], r["workload"], int(t)))
                drafter.extend(r["request"], output[t : t + 1])
    for i in pending:
        drafter.finish(info[i][0]["request"], info[i][2])
    return rows


def tree_rows(tree: CacheTree, continuation: np.ndarray, request: int, workload: str, decode_pos: int) -> list[dict]:
    """The ``cache_trees`` rows of one tree draft, labelled against the target's continuation."""
    depth = tree.depths()
    labels = oracle_tree_labels(tree.parent, tree.token, continuation)
    return [{"request": request, "workload": workload, "decode_pos": decode_pos, "node": i,
             "parent": int(tree.parent[i]), "depth": int(depth[i]), "token": int(tree.token[i]),
             "prob": float(tree.prob[i]), "label": None if labels[i] < 0 else int(labels[i]),
             "score": tree.score, "match_len": tree.match_len, "from_global": tree.from_global,
             "lookup_ms": tree.lookup_ms} for i in range(tree.token.size)]


def reference_steps(requests: pl.DataFrame) -> pl.DataFrame:
    """A reference run's timing: one output token per step for every request of a batch (no
    speculation), so a response enters the global tree after its last token, shorter ones first."""
    n = requests["output_ids"].list.len().to_numpy()
    return pl.DataFrame({"request": np.repeat(requests["request"].to_numpy(), n),
                         "step": np.concatenate([np.arange(m) for m in n]) if n.size else np.zeros(0, np.int64),
                         "emitted": np.ones(int(n.sum()), dtype=np.int64),
                         "accepted": np.zeros(int(n.sum()), dtype=np.int64)})


ModelYields = Callable[[pl.DataFrame], list[np.ndarray]]


def teacher_forced_model_yields(draft_model, k: int, target=None) -> ModelYields:
    """``model_yields`` of a real drafter: teacher-forced on each request's output (a hidden-state
    head over its ``target``'s features)."""
    def model_yields(part: pl.DataFrame) -> list[np.ndarray]:
        return teacher_forced_accepted(draft_model, list(zip(part["prompt_ids"].to_list(),
                                                             part["output_ids"].to_list(), strict=True)), k,
                                       target=target)
    return model_yields


def build_cache_drafts(run_dir: str | Path, options: CacheOptions, draft_model, tokenizer,
                       progress: Callable[[int], None] | None = None, *,
                       model_yields: ModelYields | None = None, target=None) -> dict:
    """Write the run's ``cache_drafts`` table (beside the old one, swapped in when complete) and
    record the options in run.json. Returns the run.json ``cache`` entry.

    ``model_yields(part)`` gives the model drafter's accepted length at every position of each
    request of ``part`` (default: ``draft_model`` teacher-forced on the output; a reference run's
    stand-in drafter passes its own draws)."""
    import arctic_inference

    run_dir = Path(run_dir)
    run = open_run(run_dir, deep=False, tables=["requests", "steps"])
    meta = run.meta
    reference = meta.get("engine") == "reference"
    check_cacheable(run_dir, meta)
    k = int(meta["k"])
    bs = int((meta.get("config") or {}).get("batch_size", 1) or 1)
    requests = run.scan("requests").sort("request").collect()
    if requests["request"].n_unique() != requests.height:
        raise DataError(f"{run_dir}: the requests table repeats request ids.")
    steps = (reference_steps(requests) if reference
             else run.scan("steps").select("request", "step", "emitted", "accepted").collect())
    vocab = int(draft_model.config.vocab_size) if draft_model is not None else len(tokenizer)
    classes = char_class_table(tokenizer, vocab)
    if model_yields is None:
        model_yields = teacher_forced_model_yields(draft_model, k, target)
    drafter = CacheDrafter(options)
    tmp = run_dir / ".cache_drafts.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    batches = requests.with_columns((pl.col("request") // bs).alias("_b")).partition_by("_b", maintain_order=True)
    n_rows, n_nodes, lookup = 0, 0, []
    for part in batches:
        b = int(part["_b"][0])
        part = part.drop("_b")
        trees: list[dict] | None = [] if options.tree else None
        rows = cache_rows_for_batch(drafter, options, classes, part,
                                    steps.filter(pl.col("request").is_in(part["request"].implode())), trees)
        if trees:
            write_shard(tmp, "cache_trees", b, pl.DataFrame(trees, schema=get_table("cache_trees").columns))
            n_nodes += len(trees)
        model = model_yields(part)
        by_req = dict(zip(part["request"].to_list(), model, strict=True))
        for row in rows:
            row["model_accepted"] = int(by_req[row["request"]][row["decode_pos"]])
        if rows:
            frame = pl.DataFrame(rows)
            write_shard(tmp, "cache_drafts", b, frame)
            # write_shard puts shards in tmp/cache_drafts; flatten below
            lookup.append(frame["lookup_ms"].to_numpy())
            n_rows += frame.height
        if progress is not None:
            progress(part.height)
    staged = tmp / "cache_drafts"
    if not staged.is_dir():
        raise DataError(f"{run_dir}: no decode positions to propose cache drafts at.")
    if options.tree and not (tmp / "cache_trees").is_dir():  # no position had a tree: an empty table
        write_shard(tmp, "cache_trees", 0, pl.DataFrame(schema=get_table("cache_trees").columns))
    swap_table(run_dir, "cache_drafts", staged)
    if options.tree:
        swap_table(run_dir, "cache_trees", tmp / "cache_trees")
    else:  # a redo without trees: the old trees belong to the old drafts
        shutil.rmtree(run_dir / "cache_trees", ignore_errors=True)
    shutil.rmtree(tmp, ignore_errors=True)
    ms = np.concatenate(lookup)
    entry = {"options": options.to_dict(), "arctic_inference": getattr(arctic_inference, "__version__", None)
             or dist_version("arctic-inference"), "rows": n_rows, "k": k,
             "lookup_ms_median": float(np.median(ms)), "lookup_ms_mean": float(ms.mean()),
             "global_tree": "a response enters when its request finishes (after its last engine step)" if not reference
             else "a response enters after its last token: a batch's requests advance one token per step",
             "columns": list(ROW_COLUMNS)}
    if options.tree:
        entry["trees"] = {"nodes": n_nodes, "source": "arctic-inference speculate(use_tree_spec=True) from the "
                          "same cache state as each position's chain draft; labels: greedy verification "
                          "against the run's output"}
    _record_cache(run_dir, entry, n_rows, n_nodes if options.tree else None)
    return entry


def check_cacheable(run_dir: Path, meta: dict) -> None:
    """Cache drafts are replayed on a complete, whole, greedy run of svt's engine (or a reference run)."""
    if meta.get("engine", "svt") not in ("svt", "reference"):
        raise DataError(f"{run_dir}: a {meta['engine']} run. `svt cache` replays SuffixDecoding in the server "
                        "order of svt's own static batches, with every output token from a verification step; "
                        "an engine run (continuous batching, its first token from prefill) has neither, so the "
                        "replayed drafts would not be what a server saw. Not supported.")
    if not (meta.get("sampling") or {}).get("greedy"):
        raise ConfigError(f"{run_dir}: cache drafts and their oracle yields are defined on greedy runs "
                          "(temperature 0); this run sampled at temperature "
                          f"{(meta.get('sampling') or {}).get('temperature')}.")
    if meta.get("av"):
        raise ConfigError(f"{run_dir}: collected with live AV; cache drafts need a plain greedy run.")
    if isinstance(meta.get("tree"), dict):
        raise ConfigError(f"{run_dir}: a tree run (draft trees, `tree_drafts`). Its report and fits read the tree "
                          "nodes, never cache tables, so cache drafts written here would be ignored by `svt "
                          "evaluate` and refused by the yield fits. Run `svt cache` on a greedy chain run of the "
                          "same pair instead (`trees: null` in the collect config).")
    if isinstance(meta.get("shard"), dict):
        raise ConfigError(f"{run_dir}: a shard ({meta['shard'].get('index')}/{meta['shard'].get('count')}). "
                          "A shard's global suffix tree holds only its own responses, so its cache drafts are "
                          "not the whole run's; `svt merge` the shards first, then `svt cache` the merged run.")
    if meta.get("status") != "complete":
        raise DataError(f"{run_dir}: the run is not complete (status {meta.get('status')!r}); finish it with "
                        "`svt collect ... --resume` first.")
    if not isinstance(meta.get("k"), int):
        raise DataError(f"{run_dir}: run.json has no valid `k`.")


def _record_cache(run_dir: Path, entry: dict, n_rows: int, n_nodes: int | None = None) -> None:
    """run.json: the cache entry, the new shards, the drafter kinds and the counts."""
    meta = read_meta(run_dir)
    forget_shards(meta, "cache_drafts")
    forget_shards(meta, "cache_trees")
    if "shards" in meta:
        record_shards(meta, "cache_drafts", list_shards(run_dir, "cache_drafts"))
        if n_nodes is not None:
            record_shards(meta, "cache_trees", list_shards(run_dir, "cache_trees"))
    meta["cache"] = entry
    kinds = meta.get("drafter_kinds") or ["model"]
    meta["drafter_kinds"] = [*kinds, "cache"] if "cache" not in kinds else kinds
    counts = meta.get("counts") or {}
    counts["cache_drafts"] = n_rows
    counts.pop("cache_trees", None)
    if n_nodes is not None:
        counts["cache_trees"] = n_nodes
    meta["counts"] = counts
    write_meta(run_dir, meta)


def dist_version(name: str) -> str | None:
    """The installed version of a distribution (``arctic-inference``), or None."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None
