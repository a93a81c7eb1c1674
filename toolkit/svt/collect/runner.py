"""Run a collection: workloads -> batches -> engine -> sharded run directory (resumable).

Each batch of requests is written as one shard per table, the ``requests`` shard last: a batch
whose ``requests`` shard run.json records is complete. ``--resume`` keeps complete batches, removes shards of
an interrupted batch, and runs the rest with the same per-batch random streams, so a resumed run
holds exactly the rows an uninterrupted one would.
"""

from __future__ import annotations

import datetime as dt
import platform
import shutil
import uuid
from pathlib import Path

import numpy as np
import polars as pl
import torch

from svt import __version__
from svt.collect.engine import BatchLog, LogOptions, SamplingParams, run_batch
from svt.collect.workloads import (
    encode_prompt,
    encode_reference,
    interleave,
    read_workload,
    resolve_workload,
)
from svt.config import CollectConfig, resolve_path, to_dict
from svt.errors import ConfigError
from svt.fileio import file_sha256
from svt.models.loading import load_pair
from svt.signals import sigterm_unwinds
from svt.traces.io import (
    read_meta,
    remove_partial,
    write_meta,
)
from svt.traces.rundir import (
    RunSummary,
    commit_batch,
    completed_batches,
    finish_run,
    prepare_dir,
    staging_path,
    swap_in,
)
from svt.traces.schema import SCHEMA_VERSION, TABLES


def _check_resume_inputs(out: Path, old_meta: dict, pair, workload_hashes: dict[str, str]) -> None:
    """A resumed run must use the same models (weights hashes) and prompt files (content hashes)
    as the session that started it: otherwise one run would mix two experiments."""
    now = pair.identity()
    for role in ("target", "draft"):
        was = (old_meta.get("models") or {}).get(role, {}).get("weights_sha256_16")
        if was and was != now[role]["weights_sha256_16"]:
            raise ConfigError(f"Cannot resume {str(out)!r}: the {role} model's weights changed since the run "
                              f"started (hash {now[role]['weights_sha256_16']} vs {was}). Use --overwrite.")
    was = old_meta.get("workload_sha256") or {}
    for name, h in workload_hashes.items():
        if name in was and was[name] != h:
            raise ConfigError(f"Cannot resume {str(out)!r}: the prompt file of workload {name!r} changed since "
                              "the run started. Use --overwrite.")


def _batch_seed(seed: int, batch: int) -> int:
    return int(np.random.SeedSequence([seed, batch]).generate_state(1, dtype=np.uint64)[0] >> 1)


def reference_frame(requests: list[int], refs: dict[int, list[int]]) -> pl.DataFrame | None:
    """The ``references`` shard of a batch: the requests whose prompt carries a reference."""
    have = [r for r in requests if r in refs]
    if not have:
        return None
    return pl.DataFrame({"request": have, "reference_ids": [refs[r] for r in have]},
                        schema={"request": pl.Int64, "reference_ids": pl.List(pl.Int32)})


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


def collect(cfg: CollectConfig, out: str | Path, *, config_path: str | Path | None = None,
            resume: bool = False, overwrite: bool = False, progress: bool = True,
            shard: tuple[int, int] | None = None) -> RunSummary:
    """Run speculative decoding over the configured workloads and write a run directory.

    ``shard=(i, n)`` collects only the batches ``b % n == i`` (see :mod:`svt.collect.shards`)."""
    final = Path(out)
    config = to_dict(cfg)
    if shard is not None:
        from svt.collect.shards import check_shardable

        check_shardable(cfg)
    old_meta = prepare_dir(final, resume=resume, overwrite=overwrite, config=config)

    # everything that can fail on bad input is checked before anything is written
    paths = [resolve_workload(w, config_path) for w in cfg.workloads]
    names = [p.stem for p in paths]
    if len(set(names)) != len(names):
        raise ConfigError(f"Workload names must be distinct, but got {names}.")
    prompts = interleave([read_workload(p) for p in paths], cfg.requests)
    workload_hashes = {n: file_sha256(p) for n, p in zip(names, paths, strict=True)}
    pair = load_pair(resolve_path(cfg.target, config_path), resolve_path(cfg.draft, config_path),
                     device=cfg.device, dtype=cfg.dtype)
    if old_meta:
        _check_resume_inputs(final, old_meta, pair, workload_hashes)
    if cfg.av is not None:
        from svt.fit import live_confidence, load_fit
        from svt.simulate.costs import load_costs

        live_confidence(load_fit(resolve_path(cfg.av.fit, config_path)))
        load_costs(resolve_path(cfg.av.costs, config_path)).check_covers(cfg.k, f"{cfg.av.costs}: ")
    if cfg.hvd is not None:
        from svt.collect.hvd_live import yield_scorer
        from svt.fit import load_fit

        yield_scorer(load_fit(resolve_path(cfg.hvd.fit, config_path)))
    # an overwrite is written beside the old run and swapped in when complete
    staged = overwrite and final.is_dir() and any(final.iterdir())
    out = staging_path(final) if staged else final
    if staged:
        shutil.rmtree(out, ignore_errors=True)
    tok = pair.tokenizer
    ids = [encode_prompt(p, tok, cfg.max_prompt_tokens) for p in prompts]
    refs = {i: encode_reference(p, tok, cfg.max_new_tokens) for i, p in enumerate(prompts) if p.reference}
    workload_of = {i: p.workload for i, p in enumerate(prompts)}
    live = online_est = None
    if cfg.av is not None and cfg.av.online and resume:
        raise ConfigError("Cannot resume a live-AV run with `av.online: true`: the estimator's state is "
                          "not saved between sessions. Use --overwrite.")
    if cfg.av is not None:
        from svt.collect.engine import LiveAV
        from svt.fit import live_confidence, load_fit
        from svt.simulate.costs import load_costs

        fit = load_fit(resolve_path(cfg.av.fit, config_path))
        costs = load_costs(resolve_path(cfg.av.costs, config_path))
        if cfg.av.online:
            from svt.fit.irls_online import OnlineOptions
            from svt.fit.live import OnlineLive

            if fit["model"] != "irls-online":
                raise ConfigError("`av.online: true` needs an irls-online fit (its options are used).")
            live_confidence(fit)  # the same checks: a lossless feature
            online_est = OnlineLive(OnlineOptions(**fit["options"]), cfg.k)
            live = LiveAV(online_est.confidence, costs, cfg.av.explore, online_est.observe,
                          online_est.warming_up, rule=cfg.av.rule)
        else:
            online_est = None
            live = LiveAV(live_confidence(fit), costs, cfg.av.explore, rule=cfg.av.rule)
    batches = [list(range(i, min(i + cfg.batch_size, cfg.requests)))
               for i in range(0, cfg.requests, cfg.batch_size)]
    try:
        with sigterm_unwinds():  # a `kill` unwinds through the cleanup below
            return _collect_into(cfg, out, final, staged, config_path, old_meta, config, pair, ids, workload_of,
                                 names, paths, workload_hashes, batches, live, online_est, progress, shard, refs)
    except BaseException:
        if staged:  # an interrupted overwrite: the old run is untouched; drop the partial new one
            try:
                remove_partial(out)
            except KeyboardInterrupt:  # the same Ctrl-C, left pending by polars
                remove_partial(out)
        raise


def _collect_into(cfg, out, final, staged, config_path, old_meta, config, pair, ids, workload_of, names, paths,
                  workload_hashes, batches, live, online_est, progress, shard=None, refs=None) -> RunSummary:
    import time

    from svt.collect.shards import shard_batches

    mine = shard_batches(len(batches), shard)
    if not mine:
        raise ConfigError(f"Shard {shard[0]}/{shard[1]} has no batches: the run has {len(batches)} batch(es) of "
                          f"{cfg.batch_size} requests; use fewer shards.")
    shard_meta = None if shard is None else {"index": shard[0], "count": shard[1], "batches": mine}
    if old_meta is not None and old_meta.get("shard") != shard_meta:
        was = old_meta.get("shard")
        raise ConfigError(f"Cannot resume {final}: it was collected as "
                          f"{'shard ' + str(was['index']) + '/' + str(was['count']) if was else 'a whole run'}, "
                          f"not {'shard ' + str(shard[0]) + '/' + str(shard[1]) if shard else 'a whole run'}.")

    tok = pair.tokenizer
    eos_id = tok.eos_token_id
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else (eos_id or 0)
    params = SamplingParams(cfg.temperature, cfg.top_p, cfg.k, cfg.max_new_tokens)
    log_opts = LogOptions(cfg.log.hidden, cfg.log.dists_fraction, cfg.log.dists_top_k)
    if cfg.hvd is not None:
        summary = _collect_hvd(cfg, out, config_path, old_meta, config, pair, ids, workload_of, names, paths,
                               workload_hashes, refs or {})
        return _done(summary, out, final, staged)

    done = completed_batches(out, old_meta)
    meta = old_meta or {
        "run_id": uuid.uuid4().hex[:12],
        "svt_version": __version__,
        "schema_version": SCHEMA_VERSION,
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "config": config,
    }
    meta.update({
        "status": "running",
        "models": pair.identity(),
        "sampling": {
            "temperature": cfg.temperature,
            "top_p": cfg.top_p,
            "greedy": params.greedy,
            "features_from": "unscaled softmax (T=1); greedy acceptance = argmax agreement"
            if params.greedy else "processed distributions (temperature, top-p)",
        },
        "k": cfg.k,
        "drafter_kinds": ["model"],
        "av": None if cfg.av is None else {"fit": cfg.av.fit, "costs": cfg.av.costs, "explore": cfg.av.explore,
                                           "online": cfg.av.online, "rule": cfg.av.rule,
                                           "labels": "censored: trimmed drafts have no label; steps with "
                                                     "explored = true verified every draft"},
        "workloads": {n: str(p) for n, p in zip(names, paths, strict=True)},
        "workload_sha256": workload_hashes,
        "seed": cfg.seed,
        "device": str(pair.device),
        "environment": {"python": platform.python_version(), "torch": torch.__version__,
                        "transformers": __import__("transformers").__version__,
                        "threads": torch.get_num_threads()},
        "batches": len(batches),
        "shard": shard_meta,
    })
    if shard_meta is None:
        meta.pop("shard")
    write_meta(out, meta)

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    t_start = time.time()
    todo = [b for b in mine if b not in done]
    total_tokens = 0
    with Progress(TextColumn("[bold]collect"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("requests  {task.fields[tps]} tok/s"), TimeElapsedColumn(),
                  disable=not progress, transient=False) as bar:
        task = bar.add_task("collect", total=sum(len(batches[b]) for b in mine),
                            completed=sum(len(batches[b]) for b in done),
                            tps="-")
        for b in todo:
            reqs = batches[b]
            gen = torch.Generator(device=pair.device).manual_seed(_batch_seed(cfg.seed, b))
            log = run_batch(pair.target, pair.draft, [ids[r] for r in reqs], params, eos_id=eos_id,
                            pad_id=pad_id, generator=gen, log=log_opts, request_ids=reqs, av=live)
            frames = _frames(log, workload_of, reqs, [ids[r] for r in reqs])
            ref_frame = reference_frame(reqs, refs or {})
            if ref_frame is not None:
                frames["references"] = ref_frame
            commit_batch(out, meta, b, frames)
            total_tokens += sum(len(o) for o in log.outputs)
            bar.update(task, advance=len(reqs), tps=f"{total_tokens / (time.time() - t_start):,.0f}")
    seconds = time.time() - t_start
    if live is not None and cfg.av.online:  # the estimator's path during collection
        meta["av"]["online_path"] = online_est.est.path_
        meta["av"]["online_refits"] = online_est.refits
    summary = finish_run(out, meta, seconds, resumed=len(done))
    if cfg.cache is not None:
        from svt.collect.cache_run import build_cache_drafts

        build_cache_drafts(out, cfg.cache, pair.draft, tok)
    return _done(summary, out, final, staged)


def _done(summary: RunSummary, out: Path, final: Path, staged: bool) -> RunSummary:
    if staged:
        swap_in(out, final)
        summary.run_dir = final
    return summary


def _collect_hvd(cfg: CollectConfig, out: Path, config_path, old_meta, config, pair, ids, workload_of,
                 names, paths, workload_hashes, refs: dict | None = None) -> RunSummary:
    """Live Hybrid Verified Decoding: one request at a time (one shard per request), greedy."""
    import time

    from svt.collect.cache import CacheDrafter, teacher_forced_accepted
    from svt.collect.hvd_live import decode_hvd, yield_scorer
    from svt.config import CacheOptions
    from svt.features.char_classes import char_class_table
    from svt.fit import load_fit
    from svt.metrics.repetition import common_prefix

    if cfg.batch_size != 1:
        raise ConfigError("Live HVD decodes one request at a time: set `batch_size: 1` (compare it with a "
                          "greedy run collected at batch_size 1).")
    options = cfg.cache or CacheOptions()
    fit_path = resolve_path(cfg.hvd.fit, config_path).resolve()
    fit = load_fit(fit_path)
    score = yield_scorer(fit)
    tok = pair.tokenizer
    classes = char_class_table(tok, int(pair.draft.config.vocab_size))
    drafter = CacheDrafter(options)
    done = sorted(completed_batches(out, old_meta))
    if done:  # rebuild the global tree from the finished responses, in their order
        from svt.traces.io import open_run

        prev = open_run(out, deep=False, tables=["requests"]).scan("requests").sort("request").collect()
        for r in prev.iter_rows(named=True):
            drafter.start(r["request"], np.asarray(r["prompt_ids"]))
            drafter.finish(r["request"], np.asarray(r["output_ids"]))
    import arctic_inference  # noqa: F401  (its version is recorded below)

    from svt.collect.cache_run import dist_version

    meta = old_meta or {"run_id": uuid.uuid4().hex[:12], "svt_version": __version__, "schema_version": SCHEMA_VERSION,
                        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "config": config}
    meta.update({
        "status": "running", "models": pair.identity(),
        "sampling": {"temperature": 0.0, "top_p": cfg.top_p, "greedy": True,
                     "features_from": "unscaled softmax (T=1); greedy acceptance = argmax agreement"},
        "k": cfg.k, "drafter_kinds": ["model", "cache"], "av": None,
        "hvd": {"fit": str(fit_path), "tau": cfg.hvd.tau, "live": True,
                "note": "one request at a time; steps are HVD cycles (cache or model draft)"},
        "cache": {"options": options.to_dict(), "arctic_inference": dist_version("arctic-inference"),
                  "global_tree": "a response enters when its request finishes (after its last engine step)"},
        "workloads": {n: str(p) for n, p in zip(names, paths, strict=True)}, "workload_sha256": workload_hashes,
        "seed": cfg.seed,
        "device": str(pair.device), "environment": {"python": platform.python_version(), "torch": torch.__version__,
                                                    "transformers": __import__("transformers").__version__},
        "batches": cfg.requests,
    })
    write_meta(out, meta)
    t_start = time.time()
    eos_id = tok.eos_token_id
    for r in range(cfg.requests):
        if r in done:
            continue
        log = decode_hvd(pair.target, pair.draft, ids[r], request=r, k=cfg.k, max_new_tokens=cfg.max_new_tokens,
                         eos_id=eos_id, drafter=drafter, options=options, classes=classes, predict_yield=score,
                         tau=cfg.hvd.tau)
        output = np.asarray(log.output, dtype=np.int64)
        model = teacher_forced_accepted(pair.draft, [(ids[r], log.output)], cfg.k)[0]
        rows = pl.DataFrame([{**row, "workload": workload_of[r],
                              "oracle_accepted": common_prefix(np.asarray(row["draft_ids"]), output[row["decode_pos"]:]),
                              "model_accepted": int(model[row["decode_pos"]])} for row in log.rows])
        steps = pl.DataFrame(log.cycles).with_columns(pl.lit(1).alias("batch_size"), pl.col("drafted").alias("kept"),
                                                      pl.lit(True).alias("explored"))
        if log.drafts:
            drafts = pl.DataFrame(log.drafts).with_columns(pl.lit(workload_of[r]).alias("workload"))
        else:  # every cycle verified a cache draft: an empty drafts shard of the right schema
            drafts = pl.DataFrame(schema=TABLES["drafts"].columns)
        ref_frame = reference_frame([r], refs or {})
        commit_batch(out, meta, r, {"drafts": drafts, "steps": steps, "cache_drafts": rows,
                                     **({"references": ref_frame} if ref_frame is not None else {}),
                                     "requests": pl.DataFrame(
            {"request": [r], "workload": [workload_of[r]], "prompt_ids": [ids[r]], "output_ids": [log.output],
             "finish_reason": [log.finish]},
            schema_overrides={"prompt_ids": pl.List(pl.Int32), "output_ids": pl.List(pl.Int32)})})
    summary = finish_run(out, meta, time.time() - t_start, resumed=len(done))
    from svt.traces.io import open_run

    run = open_run(out, deep=False)
    st = run.scan("steps").select(pl.len().alias("cycles"), pl.col("emitted").sum().alias("tokens")).collect().row(0)
    model_cycles = run.scan("drafts").select(pl.struct("request", "step").n_unique()).collect().item()
    meta = read_meta(out)
    meta["hvd"].update({"cycles": st[0], "tokens": st[1], "cycles_per_1000": 1000.0 * st[0] / max(st[1], 1),
                        "cache_cycles": st[0] - model_cycles})
    meta["cache"]["rows"] = run.scan("cache_drafts").select(pl.len()).collect().item()
    write_meta(out, meta)
    return summary
