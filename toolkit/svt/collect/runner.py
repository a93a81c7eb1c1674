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

from svt.collect.engine import P_COLUMNS, BatchLog, LogOptions, SamplingParams, run_batch
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
    if log.drafts:
        cat = {k: np.concatenate(v) for k, v in log.drafts.items()}
        label = cat.pop("label")
        drafts = pl.DataFrame(cat).with_columns(
            pl.Series("label", label).replace(-1, None).cast(pl.Int8),
            pl.col("request").replace_strict(workload_of, return_dtype=pl.String).alias("workload"),
            *(pl.col(c).fill_nan(None) for c in P_COLUMNS),  # trimmed before the target computed them
        )
    else:  # plain decoding (k = 0) drafts nothing
        drafts = pl.DataFrame(schema=TABLES["drafts"].columns)
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
    if log.schedule:
        frames["schedule"] = pl.DataFrame({k: np.concatenate(v) for k, v in log.schedule.items()})
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
        "schedule": {"kind": cfg.schedule, "slots": cfg.batch_size,
                     "steps": "engine ticks: a request's steps are the ticks it decoded in" if cfg.schedule ==
                     "continuous" else "per batch, from 0"},
        "drafter_kinds": [plan.pair.draft_kind],
        # a step whose rows keep different numbers of drafts (live AV) pads them to the longest
        "verification": "padded",
        "av": None if av is None else {"fit": av.fit, "costs": av.costs, "explore": av.explore,
                                       "online": av.online, "rule": av.rule, "length": av.length,
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


def _warm_up(plan: CollectPlan, todo: list[int], params: SamplingParams, pad_id: int) -> float:
    """A throwaway decode of a few steps at the run's batch size before the timed ones, as a serving
    engine warms up before it serves: the first forwards of a process pay one-time costs (allocator,
    thread pools, kernel selection) of up to a second on a CPU, which would land on the first
    steps' times. Its own random stream and caches: the run's rows are unchanged. Returns seconds."""
    if not todo:
        return 0.0
    t0 = time.perf_counter()
    reqs = plan.batches[todo[0]]
    prompts = [plan.ids[r][-32:] for r in reqs]
    run_batch(plan.pair.target, plan.pair.draft, prompts, SamplingParams(params.temperature, params.top_p, params.k, 4),
              eos_id=None, pad_id=pad_id, generator=torch.Generator(device=plan.pair.device).manual_seed(0))
    return round(time.perf_counter() - t0, 3)


def _run_static(plan: CollectPlan, todo: list[int], params, eos_id, pad_id, log_opts, commit) -> None:
    """Each batch alone, with its own random stream, committed when it ends."""
    pair = plan.pair
    for b in todo:
        reqs = plan.batches[b]
        gen = torch.Generator(device=pair.device).manual_seed(batch_seed(plan.cfg.seed, b))
        commit(b, run_batch(pair.target, pair.draft, [plan.ids[r] for r in reqs], params, eos_id=eos_id,
                            pad_id=pad_id, generator=gen, log=log_opts, request_ids=reqs, av=plan.live))


def _run_continuous(plan: CollectPlan, todo: list[int], params, eos_id, pad_id, log_opts, commit) -> None:
    """Every batch's requests through one continuously batched engine (``batch_size`` slots). A
    batch is committed, in order, between two engine steps once all its requests have finished, with
    the engine steps (``schedule`` rows) logged since the last commit. One random stream, from the
    first batch not yet committed: a resumed run redoes the rest as a fresh continuous run from there
    (lossless; a greedy run decodes the same tokens up to float ties between batch compositions)."""
    if not todo:
        return
    pair = plan.pair
    order = [r for b in todo for r in plan.batches[b]]
    position = {r: i for i, r in enumerate(order)}
    finished: set[int] = set()
    nxt = 0  # the next batch of `todo` to commit

    def on_finish(indices: list[int], log: BatchLog) -> None:
        nonlocal nxt
        finished.update(order[i] for i in indices)
        while nxt < len(todo) and all(r in finished for r in plan.batches[todo[nxt]]):
            reqs = plan.batches[todo[nxt]]
            part = log.take(reqs)
            part.outputs = [log.outputs[position[r]] for r in reqs]
            part.finish = [log.finish[position[r]] for r in reqs]
            commit(todo[nxt], part)
            nxt += 1

    gen = torch.Generator(device=pair.device).manual_seed(batch_seed(plan.cfg.seed, todo[0]))
    run_batch(pair.target, pair.draft, [plan.ids[r] for r in order], params, eos_id=eos_id, pad_id=pad_id,
              generator=gen, log=log_opts, request_ids=order, av=plan.live, slots=plan.cfg.batch_size,
              on_finish=on_finish, first_tick=_next_tick(plan.out))


def _next_tick(out) -> int:
    """A resumed continuous run numbers its engine steps after the committed ones'."""
    from svt.traces.io import list_shards

    shards = list_shards(out, "schedule")
    if not shards:
        return 0
    last = pl.scan_parquet([str(p) for p in shards]).select(pl.col("tick").max()).collect().item()
    return 0 if last is None else int(last) + 1


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
    if done:  # the engine steps of two sessions: its timings are not one run's
        meta["schedule"]["resumed"] = True
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
        def commit(b: int, log: BatchLog) -> None:
            nonlocal total_tokens
            reqs = plan.batches[b]
            frames = _frames(log, workload_of, reqs, [plan.ids[r] for r in reqs])
            ref_frame = reference_frame(reqs, plan.refs)
            if ref_frame is not None:
                frames["references"] = ref_frame
            commit_batch(out, meta, b, frames)
            total_tokens += sum(len(o) for o in log.outputs)
            bar.update(task, advance=len(reqs), tps=f"{total_tokens / (time.time() - t_start):,.0f}")

        todo = [b for b in mine if b not in done]
        meta["warmup_seconds"] = _warm_up(plan, todo, params, pad_id)
        run = _run_continuous if cfg.schedule == "continuous" else _run_static
        run(plan, todo, params, eos_id, pad_id, log_opts, commit)
    seconds = time.time() - t_start
    if plan.online is not None:  # the estimator's path during collection
        meta["av"]["online_path"] = plan.online.est.path_
        meta["av"]["online_refits"] = plan.online.refits
    summary = finish_run(out, meta, seconds, resumed=len(done))
    if cfg.cache is not None:
        from svt.collect.cache_run import build_cache_drafts

        build_cache_drafts(out, cfg.cache, pair.draft, tok, target=pair.target)
    return summary
