"""The live Hybrid Verified Decoding engine: static batches of ``batch_size`` requests, one after
another (one shard per batch), greedy; at each step every row verifies the suffix cache's draft
when its predicted yield clears tau, the model drafter's (a draft model or a hidden-state head)
otherwise (see :mod:`svt.collect.hvd_live` for a step)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import polars as pl

from svt.collect.cache import CacheDrafter, teacher_forced_accepted
from svt.collect.cache_run import dist_version
from svt.collect.engines import CollectOptions, Engine
from svt.collect.hvd_live import HVDLog, decode_hvd, yield_scorer
from svt.collect.plan import CollectPlan
from svt.collect.runner import reference_frame, run_plan
from svt.config import CacheOptions, CollectConfig, resolve_path
from svt.features.char_classes import char_class_table
from svt.metrics.repetition import common_prefix
from svt.traces.io import open_run, read_meta, write_meta
from svt.traces.rundir import RunSummary, commit_batch, completed_batches, finish_run
from svt.traces.schema import TABLES


class HvdEngine(Engine):
    """svt's engine under the live-HVD policy of the config's ``hvd:`` section."""

    name = "hvd"
    resumable = True

    def collect(self, cfg: CollectConfig, out: Path, options: CollectOptions) -> RunSummary:
        return run_plan(cfg, out, options, collect_hvd)


def _hvd_meta(plan: CollectPlan, fit_path: Path, options: CacheOptions) -> dict:
    cfg = plan.cfg
    meta = plan.new_meta()
    env = plan.environment()
    env.pop("threads")
    meta.update({
        "status": "running", "models": plan.pair.identity(),
        "sampling": {"temperature": 0.0, "top_p": cfg.top_p, "greedy": True,
                     "features_from": "unscaled softmax (T=1); greedy acceptance = argmax agreement"},
        "k": cfg.k, "drafter_kinds": ["model", "cache"], "av": None,
        "hvd": {"fit": str(fit_path), "tau": cfg.hvd.tau, "live": True, "batch_size": cfg.batch_size,
                "drafter": plan.pair.draft_kind,
                "note": "static batches, one after another; a steps row is one request's HVD cycle at one "
                        "engine step (cache or model draft)"},
        "cache": {"options": options.to_dict(), "arctic_inference": dist_version("arctic-inference"),
                  "global_tree": "a response enters when its request finishes (after its last engine step)"},
        "workloads": plan.workloads.files, "workload_sha256": plan.workloads.hashes,
        "workload_reading": plan.workloads.reading,
        "seed": cfg.seed, "device": str(plan.pair.device), "environment": env,
        "batches": len(plan.batches),
    })
    return meta


def _batch_frames(plan: CollectPlan, batch: list[int], logs: list[HVDLog]) -> dict[str, pl.DataFrame]:
    """The shards of one decoded batch: its model drafts, cycles, cache drafts (with both yields)
    and its requests."""
    model = teacher_forced_accepted(plan.pair.draft, [(plan.ids[r], log.output) for r, log in zip(batch, logs, strict=True)],
                                    plan.cfg.k, target=plan.pair.target)
    rows, cycles, drafts = [], [], []
    for r, log, acc in zip(batch, logs, model, strict=True):
        workload, output = plan.workload_of[r], np.asarray(log.output, dtype=np.int64)
        rows += [{**row, "workload": workload,
                  "oracle_accepted": common_prefix(np.asarray(row["draft_ids"]), output[row["decode_pos"]:]),
                  "model_accepted": int(acc[row["decode_pos"]])} for row in log.rows]
        cycles += log.cycles
        drafts += [{**d, "workload": workload} for d in log.drafts]
    steps = pl.DataFrame(cycles).with_columns(pl.col("drafted").alias("kept"), pl.lit(True).alias("explored"))
    # every cycle verified a cache draft: an empty drafts shard of the right schema
    drafts = pl.DataFrame(drafts) if drafts else pl.DataFrame(schema=TABLES["drafts"].columns)
    frames = {"drafts": drafts, "steps": steps, "cache_drafts": pl.DataFrame(rows)}
    ref_frame = reference_frame(batch, plan.refs)
    if ref_frame is not None:
        frames["references"] = ref_frame
    frames["requests"] = pl.DataFrame(
        {"request": batch, "workload": [plan.workload_of[r] for r in batch], "prompt_ids": [plan.ids[r] for r in batch],
         "output_ids": [log.output for log in logs], "finish_reason": [log.finish for log in logs]},
        schema_overrides={"prompt_ids": pl.List(pl.Int32), "output_ids": pl.List(pl.Int32)})
    return frames


def _record_cycles(out: Path) -> None:
    """run.json's HVD totals: cycles, tokens, cycles per 1,000 tokens and how many verified the cache."""
    run = open_run(out, deep=False)
    st = run.scan("steps").select(pl.len().alias("cycles"), pl.col("emitted").sum().alias("tokens")).collect().row(0)
    model_cycles = run.scan("drafts").select(pl.struct("request", "step").n_unique()).collect().item()
    meta = read_meta(out)
    meta["hvd"].update({"cycles": st[0], "tokens": st[1], "cycles_per_1000": 1000.0 * st[0] / max(st[1], 1),
                        "cache_cycles": st[0] - model_cycles})
    meta["cache"]["rows"] = run.scan("cache_drafts").select(pl.len()).collect().item()
    write_meta(out, meta)


def collect_hvd(plan: CollectPlan) -> RunSummary:
    """The hvd engine's body: every request not yet complete, decoded and committed in order."""
    cfg, pair, out = plan.cfg, plan.pair, plan.out
    import arctic_inference  # noqa: F401  (its version is recorded in run.json)
    options = cfg.cache or CacheOptions()
    fit_path = resolve_path(cfg.hvd.fit, plan.config_path).resolve()
    from svt.fit import Fitter

    score = yield_scorer(Fitter.load(fit_path))
    classes = char_class_table(pair.tokenizer, int(pair.draft.config.vocab_size))
    drafter = CacheDrafter(options)
    done = sorted(completed_batches(out, plan.old_meta))
    if done:  # rebuild the global tree from the finished responses, in the order they entered it
        _refill_global_tree(drafter, out)
    meta = _hvd_meta(plan, fit_path, options)
    write_meta(out, meta)
    t_start = time.time()
    eos_id = pair.tokenizer.eos_token_id
    pad_id = pair.tokenizer.pad_token_id if pair.tokenizer.pad_token_id is not None else (eos_id or 0)
    for b, batch in enumerate(plan.batches):
        if b in done:
            continue
        logs, schedule = decode_hvd(pair.target, pair.draft, [plan.ids[r] for r in batch], requests=batch, k=cfg.k,
                          max_new_tokens=cfg.max_new_tokens, eos_id=pair.tokenizer.eos_token_id, pad_id=pad_id,
                          drafter=drafter, options=options, classes=classes, predict_yield=score, tau=cfg.hvd.tau)
        commit_batch(out, meta, b, {**_batch_frames(plan, batch, logs), "schedule": schedule_frame(schedule)})
    summary = finish_run(out, meta, time.time() - t_start, resumed=len(done))
    _record_cycles(out)
    return summary


def schedule_frame(rows: list[dict]) -> pl.DataFrame:
    """A batch's ``schedule`` shard, in the table's types."""
    from svt.traces.schema import TABLES as T

    return pl.DataFrame(rows).cast({c: t for c, t in T["schedule"].columns.items()})


def _refill_global_tree(drafter: CacheDrafter, out: Path) -> None:
    """The committed batches' responses into the global tree, in the order the live run put them:
    batch by batch (static batches in request order), within a batch by the step each request
    finished at, then by request."""
    run = open_run(out, deep=False, tables=["requests", "steps"])
    last = run.scan("steps").group_by("request").agg(pl.col("step").max().alias("_last")).collect()
    prev = run.scan("requests").collect().join(last, on="request", how="left")
    batch_of = {r: i for i, rs in enumerate(_batches_of(prev["request"].to_list(), read_meta(out))) for r in rs}
    prev = prev.with_columns(pl.col("request").replace_strict(batch_of).alias("_batch")).sort("_batch", "_last", "request")
    for r in prev.iter_rows(named=True):
        drafter.start(r["request"], np.asarray(r["prompt_ids"]))
        drafter.finish(r["request"], np.asarray(r["output_ids"]))


def _batches_of(requests: list[int], meta: dict) -> list[list[int]]:
    size = int((meta.get("config") or {}).get("batch_size", 1))
    return [[r for r in requests if r // size == i] for i in sorted({r // size for r in requests})]
