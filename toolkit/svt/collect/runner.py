"""svt's own engine: workloads -> batches -> batched speculative sampling -> a sharded run
directory (resumable).

Each batch of requests is written as one shard per table, the ``requests`` shard last: a batch
whose ``requests`` shard run.json records is complete. ``--resume`` keeps complete batches, removes shards of
an interrupted batch, and runs the rest with the same per-batch random streams, so a resumed run
holds exactly the rows an uninterrupted one would.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import polars as pl
import torch

from svt.collect.engine import BatchLog, LogOptions, SamplingParams, run_batch
from svt.collect.engines import CollectOptions, Engine
from svt.collect.plan import CollectPlan, batch_seed, plan_collection
from svt.config import CollectConfig
from svt.errors import ConfigError
from svt.fileio import writing
from svt.signals import sigterm_unwinds
from svt.traces.io import remove_partial, write_meta
from svt.traces.rundir import RunSummary, commit_batch, completed_batches, finish_run, swap_in
from svt.traces.schema import TABLES


class SvtEngine(Engine):
    """Batched speculative sampling on a local pair (live AV when the config has ``av:``)."""

    name = "svt"
    resumable = True
    shardable = True

    def collect(self, cfg: CollectConfig, out: Path, options: CollectOptions) -> RunSummary:
        return run_plan(cfg, out, options, collect_batches)


def run_plan(cfg: CollectConfig, out: Path, options: CollectOptions, body) -> RunSummary:
    """Plan, run ``body(plan)`` into the plan's folder, swap an overwrite in; an interrupted
    overwrite leaves the old run untouched and no partial new one."""
    def plan() -> CollectPlan:  # the output's checks (empty, --resume, --overwrite) run while it is held
        return plan_collection(cfg, out, config_path=options.config_path, resume=options.resume,
                               overwrite=options.overwrite, progress=options.progress, shard=options.shard)

    with writing(out, plan) as planned:  # one writer per output: a second collect is refused before it plans
        return _run_locked(planned, body)


def _run_locked(plan: CollectPlan, body) -> RunSummary:
    try:
        with sigterm_unwinds():  # a `kill` unwinds through the cleanup below
            summary = body(plan)
            if plan.staged:
                swap_in(plan.out, plan.final)
                summary.run_dir = plan.final
    except BaseException:
        if plan.staged:
            try:
                remove_partial(plan.out)
            except KeyboardInterrupt:  # the same Ctrl-C, left pending by polars
                remove_partial(plan.out)
        raise
    return summary


def reference_frame(requests: list[int], refs: dict[int, list[int]]) -> pl.DataFrame | None:
    """The ``references`` shard of a batch: the requests whose prompt carries a reference."""
    have = [r for r in requests if r in refs]
    if not have:
        return None
    return pl.DataFrame({"request": have, "reference_ids": [refs[r] for r in have]},
                        schema={"request": pl.Int64, "reference_ids": pl.List(pl.Int32)})


def request_shards(plan: CollectPlan, r: int, output: list[int], finish: str) -> dict[str, pl.DataFrame]:
    """The ``references`` (if its prompt carries one) and ``requests`` shards of a run decoded one
    request at a time (the hvd and tree engines), the requests shard last."""
    frames = {}
    ref_frame = reference_frame([r], plan.refs)
    if ref_frame is not None:
        frames["references"] = ref_frame
    frames["requests"] = pl.DataFrame(
        {"request": [r], "workload": [plan.workload_of[r]], "prompt_ids": [plan.ids[r]], "output_ids": [output],
         "finish_reason": [finish]},
        schema_overrides={"prompt_ids": pl.List(pl.Int32), "output_ids": pl.List(pl.Int32)})
    return frames


def _frames(log: BatchLog, workload_of: dict[int, str], batch_requests, prompts) -> dict[str, pl.DataFrame]:
    cat = {k: np.concatenate(v) for k, v in log.drafts.items()}
    label = cat.pop("label")
    drafts = pl.DataFrame(cat).with_columns(
        pl.Series("label", label).replace(-1, None).cast(pl.Int8),
        pl.col("request").replace_strict(workload_of, return_dtype=pl.String).alias("workload"),
    )
    steps = pl.DataFrame({k: np.concatenate(v) for k, v in log.steps.items()})
    requests = pl.DataFrame(
        {
            "request": batch_requests,
            "workload": [workload_of[r] for r in batch_requests],
            "prompt_ids": prompts,
            "output_ids": log.outputs,
            "finish_reason": log.finish,
        },
        schema_overrides={"prompt_ids": pl.List(pl.Int32), "output_ids": pl.List(pl.Int32)},
    )
    frames = {"drafts": drafts, "steps": steps, "requests": requests}
    if log.hidden:
        hid = np.concatenate(log.hidden)
        frames["hidden"] = drafts.select("request", "step", "position").with_columns(
            pl.Series("hidden", hid.astype(np.float32)).cast(TABLES["hidden"].columns["hidden"])
        )
    if log.dists:
        d = {k: np.concatenate(v) for k, v in log.dists.items()}
        frames["dists"] = pl.DataFrame({k: (list(v) if v.ndim > 1 else v) for k, v in d.items()})
    return frames


def _shard_batches(plan: CollectPlan) -> tuple[list[int], dict | None]:
    """The batches this session's shard holds, and run.json's ``shard`` record (None: a whole run)."""
    from svt.collect.shards import shard_batches

    shard = plan.shard
    mine = shard_batches(len(plan.batches), shard)
    if not mine:
        raise ConfigError(f"Shard {shard[0]}/{shard[1]} has no batches: the run has {len(plan.batches)} batch(es) "
                          f"of {plan.cfg.batch_size} requests; use fewer shards.")
    shard_meta = None if shard is None else {"index": shard[0], "count": shard[1], "batches": mine}
    if plan.old_meta is not None and plan.old_meta.get("shard") != shard_meta:
        was = plan.old_meta.get("shard")
        raise ConfigError(f"Cannot resume {plan.final}: it was collected as "
                          f"{'shard ' + str(was['index']) + '/' + str(was['count']) if was else 'a whole run'}, "
                          f"not {'shard ' + str(shard[0]) + '/' + str(shard[1]) if shard else 'a whole run'}.")
    return mine, shard_meta


def _run_meta(plan: CollectPlan, params: SamplingParams, shard_meta: dict | None) -> dict:
    cfg, av = plan.cfg, plan.cfg.av
    meta = plan.new_meta()
    meta.update({
        "status": "running",
        "models": plan.pair.identity(),
        "sampling": {
            "temperature": cfg.temperature,
            "top_p": cfg.top_p,
            "greedy": params.greedy,
            "features_from": "unscaled softmax (T=1); greedy acceptance = argmax agreement"
            if params.greedy else "processed distributions (temperature, top-p)",
        },
        "k": cfg.k,
        "drafter_kinds": [plan.pair.draft_kind],
        "av": None if av is None else {"fit": av.fit, "costs": av.costs, "explore": av.explore,
                                       "online": av.online, "rule": av.rule,
                                       "labels": "censored: trimmed drafts have no label; steps with "
                                                 "explored = true verified every draft"},
        "workloads": plan.workloads.files,
        "workload_sha256": plan.workloads.hashes,
        "workload_reading": plan.workloads.reading,
        "seed": cfg.seed,
        "device": str(plan.pair.device),
        "environment": plan.environment(),
        "batches": len(plan.batches),
        "shard": shard_meta,
    })
    if shard_meta is None:
        meta.pop("shard")
    return meta


def collect_batches(plan: CollectPlan) -> RunSummary:
    """The svt engine's body: every batch of this shard not yet complete, committed one by one."""
    cfg, pair, out = plan.cfg, plan.pair, plan.out
    mine, shard_meta = _shard_batches(plan)
    tok = pair.tokenizer
    eos_id = tok.eos_token_id
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else (eos_id or 0)
    params = SamplingParams(cfg.temperature, cfg.top_p, cfg.k, cfg.max_new_tokens)
    log_opts = LogOptions(cfg.log.hidden, cfg.log.dists_fraction, cfg.log.dists_top_k)
    done = completed_batches(out, plan.old_meta)
    meta = _run_meta(plan, params, shard_meta)
    write_meta(out, meta)
    workload_of = plan.workload_of

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    t_start = time.time()
    total_tokens = 0
    with Progress(TextColumn("[bold]collect"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("requests  {task.fields[tps]} tok/s"), TimeElapsedColumn(),
                  disable=not plan.progress, transient=False) as bar:
        task = bar.add_task("collect", total=sum(len(plan.batches[b]) for b in mine),
                            completed=sum(len(plan.batches[b]) for b in done), tps="-")
        for b in (b for b in mine if b not in done):
            reqs = plan.batches[b]
            gen = torch.Generator(device=pair.device).manual_seed(batch_seed(cfg.seed, b))
            log = run_batch(pair.target, pair.draft, [plan.ids[r] for r in reqs], params, eos_id=eos_id,
                            pad_id=pad_id, generator=gen, log=log_opts, request_ids=reqs, av=plan.live)
            frames = _frames(log, workload_of, reqs, [plan.ids[r] for r in reqs])
            ref_frame = reference_frame(reqs, plan.refs)
            if ref_frame is not None:
                frames["references"] = ref_frame
            commit_batch(out, meta, b, frames)
            total_tokens += sum(len(o) for o in log.outputs)
            bar.update(task, advance=len(reqs), tps=f"{total_tokens / (time.time() - t_start):,.0f}")
    seconds = time.time() - t_start
    if plan.online is not None:  # the estimator's path during collection
        meta["av"]["online_path"] = plan.online.est.path_
        meta["av"]["online_refits"] = plan.online.refits
    summary = finish_run(out, meta, seconds, resumed=len(done))
    if cfg.cache is not None:
        from svt.collect.cache_run import build_cache_drafts

        build_cache_drafts(out, cfg.cache, pair.draft, tok, target=pair.target)
    return summary
