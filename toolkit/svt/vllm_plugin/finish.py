"""Turn a plugin's spool into a run directory of svt's schema (``svt vllm-finish``).

The spool holds rows keyed by vLLM's request ids, one folder per process. This puts them together:
requests get svt's integer ids (the order the caller gave, when it says; else the order they
finished), only whole flushes are read, and the rows are cross-checked (each step's accepted count
against its labels, every draft's request finished once) before anything is written. The run is
written beside ``out`` and renamed into place when complete.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
import uuid
from pathlib import Path

import polars as pl

from svt.errors import ConfigError, DataError
from svt.traces.io import open_run, record_shards, write_meta, write_shard
from svt.traces.schema import FINISH_REASONS, SCHEMA_VERSION
from svt.vllm_plugin.recorder import SPOOL_SCHEMAS

SHARD_REQUESTS = 4096  # requests per shard of the finished run


def read_spool(trace_dir: str | Path) -> tuple[dict[str, pl.DataFrame], list[dict], dict]:
    """The spool's tables (whole flushes only), each process's facts, and the summed counters."""
    root = Path(trace_dir) / "spool"
    if not root.is_dir():
        raise DataError(f"{trace_dir}: no `spool` folder; expected a directory vLLM traced into with "
                        "SVT_TRACE_DIR set.")
    frames: dict[str, list[pl.DataFrame]] = {t: [] for t in SPOOL_SCHEMAS}
    facts, counters, notes = [], {}, {}
    for proc in sorted(p for p in root.iterdir() if p.is_dir()):
        if (proc / "process.json").is_file():
            facts.append(json.loads((proc / "process.json").read_text()))
        for done in sorted(proc.glob("*.done")):
            n = done.stem
            try:
                marker = json.loads(done.read_text())
            except json.JSONDecodeError as exc:
                raise DataError(f"{done}: not valid JSON ({exc}).") from None
            for table, schema in SPOOL_SCHEMAS.items():
                path = proc / f"{n}-{table}.parquet"
                if not path.is_file():
                    raise DataError(f"{path}: missing, but {done.name} says the flush is whole.")
                frame = pl.read_parquet(path)
                if dict(frame.schema) != dict(pl.Schema(schema)):
                    raise DataError(f"{path}: columns {dict(frame.schema)} are not the spool's {schema}.")
                if frame.height != marker["rows"][table]:
                    raise DataError(f"{path}: {frame.height} rows, but {done.name} recorded "
                                    f"{marker['rows'][table]}.")
                frames[table].append(frame)
            for k, v in marker.get("counters", {}).items():  # cumulative per process: keep the last
                counters.setdefault(proc.name, {})[k] = v
            for k, v in marker.get("notes", {}).items():
                notes[k] = notes.get(k) or v
    total = {}
    for per_proc in counters.values():
        for k, v in per_proc.items():
            total[k] = total.get(k, 0) + v
    tables = {t: pl.concat(f) if f else pl.DataFrame(schema=SPOOL_SCHEMAS[t]) for t, f in frames.items()}
    return tables, facts, {"counters": total, "notes": notes}


def finish_spool(trace_dir: str | Path, out: str | Path, *, overwrite: bool = False,
                 order: list[str] | None = None, workloads: dict[str, str] | None = None,
                 meta: dict | None = None, draft: str | Path | None = None) -> dict:
    """Write the run ``out`` from the spool in ``trace_dir``; return its run.json.

    ``order``: the caller's request ids in svt's request order (``svt collect --engine vllm`` gives
    them); ``workloads``: caller's id -> workload name. ``meta`` is merged into run.json. ``draft``:
    the model drafter whose accepted length labels the engine's suffix drafts (``model_accepted``)."""
    out = Path(out)
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise ConfigError(f"{out} exists and is not empty; pass --overwrite to replace it.")
    tables, facts, status = read_spool(trace_dir)
    if status["counters"].get("plugin_errors"):
        raise DataError(f"{trace_dir}: the trace plugin failed {status['counters']['plugin_errors']} time(s) while the "
                        f"engine ran (first: {status['notes'].get('first_plugin_error')}); the spool is incomplete, "
                        "so no run is written.")
    if status["counters"].get("nonfinite_drafts"):
        raise DataError(f"{trace_dir}: the engine gave NaN or infinite probabilities at "
                        f"{status['counters']['nonfinite_drafts']} draft(s); its sampling path is broken "
                        "(see the plugin's notes on vLLM CPU builds), so no run is written.")
    reqs = tables["requests"]
    if reqs.height == 0:
        raise DataError(f"{trace_dir}: no finished request in the spool (the engine stopped before any "
                        "request finished, or tracing was off).")
    dup = reqs.group_by("vllm_request").len().filter(pl.col("len") > 1)
    if dup.height:
        raise DataError(f"{trace_dir}: request {dup['vllm_request'][0]!r} finished {dup['len'][0]} times; the "
                        "spool mixes two engines' runs with the same ids. Use one SVT_TRACE_DIR per run.")
    ks = {f.get("k") for f in facts if f.get("k") is not None}
    if len(ks) != 1:
        raise DataError(f"{trace_dir}: the spool's processes report K = {sorted(ks)}; expected one K.")
    k = ks.pop()
    # the caller's ids (vLLM appends a random suffix to each)
    ext = dict(zip(tables["ids"]["internal"].to_list(), tables["ids"]["external"].to_list(), strict=True))
    reqs = reqs.with_columns(pl.col("vllm_request").replace_strict(ext, default=pl.col("vllm_request"))
                             .alias("external"))
    kept = reqs.filter(pl.col("finish_reason").is_in(list(FINISH_REASONS)))
    if order is not None:
        rank = {e: i for i, e in enumerate(order)}
        missing = [e for e in order if e not in set(kept["external"].to_list())]
        if missing:
            raise DataError(f"{trace_dir}: {len(missing)} request(s) the caller sent did not finish in the "
                            f"spool (e.g. {missing[0]!r}).")
        kept = kept.filter(pl.col("external").is_in(list(rank)))
        kept = kept.with_columns(pl.col("external").replace_strict(rank, return_dtype=pl.Int64).alias("request"))
    else:
        kept = kept.with_columns(pl.int_range(pl.len(), dtype=pl.Int64).alias("request"))
    default_wl = next((f.get("workload") for f in facts if f.get("workload")), "vllm")
    wl = workloads or {}
    kept = kept.with_columns(pl.col("external").replace_strict(wl, default=default_wl, return_dtype=pl.String)
                             .alias("workload")).sort("request")
    ids = kept.select("vllm_request", "request", "workload")
    drafts = tables["drafts"].join(ids, on="vllm_request", how="inner")
    steps = tables["steps"].join(ids.drop("workload"), on="vllm_request", how="inner")
    steps = _emitted_into_output(steps, kept)
    cache = None
    if tables["cache"].height:
        from svt.vllm_plugin.cache_rows import cache_rows

        joined = tables["cache"].join(ids, on="vllm_request", how="inner")
        cache = cache_rows(joined, kept.select("request", "prompt_ids", "output_ids"), k,
                           next((f.get("target") for f in facts if f.get("target")), None), draft, trace_dir)
    dropped = {"requests_not_finished_or_aborted": reqs.height - kept.height,
               "drafts_of_dropped_requests": tables["drafts"].height - drafts.height}
    _check_consistent(drafts, steps, k, trace_dir)

    final = out
    staged = out.parent / f".{out.name}.svt-new"
    shutil.rmtree(staged, ignore_errors=True)
    try:
        run_meta = _write(staged, kept, drafts, steps, facts, status, dropped, k, meta or {}, cache, draft)
        old = out.parent / f".{out.name}.svt-old"
        shutil.rmtree(old, ignore_errors=True)
        if out.exists():
            out.rename(old)
        staged.rename(final)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    return run_meta


def _emitted_into_output(steps: pl.DataFrame, reqs: pl.DataFrame) -> pl.DataFrame:
    """``emitted``: the tokens of the output each step produced. vLLM's sampler emits accepted + 1
    tokens, but the scheduler drops those past a stop token or max_tokens at a request's last step;
    and the first output token comes from the prefill, not from a verification step."""
    budget = reqs.select("request", (pl.col("output_ids").list.len() - 1).clip(lower_bound=0).alias("_budget"))
    return (steps.sort("request", "step").join(budget, on="request", how="left")
            .with_columns(pl.col("emitted").cast(pl.Int32).cum_sum().over("request").alias("_cum"))
            .with_columns(pl.min_horizontal(pl.col("emitted").cast(pl.Int32),
                                            (pl.col("_budget") - pl.col("_cum") + pl.col("emitted")).clip(lower_bound=0))
                          .cast(pl.Int16).alias("emitted"))
            .drop("_budget", "_cum"))


def _check_consistent(drafts: pl.DataFrame, steps: pl.DataFrame, k: int, where) -> None:
    """Each step's accepted count equals its drafts' labels; positions stay below K."""
    if drafts.height and int(drafts["position"].max()) >= k:
        raise DataError(f"{where}: drafts reach position {int(drafts['position'].max())} but K = {k}.")
    per = drafts.group_by("request", "step").agg((pl.col("label") == 1).sum().alias("ones"), pl.len().alias("n"))
    both = steps.join(per, on=["request", "step"], how="full", coalesce=True)
    bad = both.filter(pl.col("ones").is_null() | pl.col("accepted").is_null() | (pl.col("ones") != pl.col("accepted"))
                      | (pl.col("n") != pl.col("kept")))
    if bad.height:
        row = bad.row(0, named=True)
        raise DataError(f"{where}: request {row['request']} step {row['step']}: the steps table and the drafts "
                        "disagree (accepted count or drafts verified); the spool is damaged.")


def _unrecorded(steps: pl.DataFrame, reqs: pl.DataFrame) -> int:
    """Requests whose output has more tokens than the recorded steps emitted (plus the prefill's
    one): steps without drafts, or verifications the plugin could not pair with their proposal."""
    per = steps.group_by("request").agg(pl.col("emitted").cast(pl.Int64).sum().alias("e"))
    both = reqs.select("request", pl.col("output_ids").list.len().alias("n")).join(per, on="request", how="left")
    return int(both.filter(pl.col("e").fill_null(0) + 1 < pl.col("n")).height)


def _models(facts: dict) -> dict:
    """The pair as run.json records it; local model folders get their weights hash (as svt's own
    collector records), so `svt cache RUN` can check it loads the same draft."""
    from svt.models.loading import weights_hash

    out: dict = {}
    for role in ("target", "draft"):
        path = facts.get(role)
        info: dict = {"path": path}
        if path and Path(path).is_dir() and any(Path(path).glob("*.safetensors")):
            info["weights_sha256_16"] = weights_hash(Path(path))
        out[role] = info
    out["dtype"] = str(facts.get("dtype") or "").removeprefix("torch.")
    return out


def _write(run: Path, reqs: pl.DataFrame, drafts: pl.DataFrame, steps: pl.DataFrame, facts: list[dict],
           status: dict, dropped: dict, k: int, extra: dict, cache: pl.DataFrame | None = None,
           draft: str | Path | None = None) -> dict:
    from svt import __version__

    f0 = facts[0]
    temps = reqs["temperature"].unique().to_list()
    tops = reqs["top_p"].unique().to_list()
    greedy = temps == [0.0]
    sampling = {"temperature": temps[0] if len(temps) == 1 else None, "top_p": tops[0] if len(tops) == 1 else None,
                "greedy": greedy,
                "features_from": "unscaled softmax (T=1); greedy acceptance = argmax agreement" if greedy
                else "processed distributions (temperature, top-p) as vLLM's rejection sampler uses them"}
    if len(temps) > 1 or len(tops) > 1:
        sampling["mixed"] = "requests were sampled with different temperatures or top-p"
    meta = {
        "run_id": uuid.uuid4().hex[:12], "svt_version": __version__, "schema_version": SCHEMA_VERSION,
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "status": "running",
        "engine": "vllm",
        "models": _models(f0),
        "sampling": sampling, "k": k, "drafter_kinds": ["cache"] if cache is not None else ["model"],
        "device": f0.get("device"),
        "vllm": {"version": f0.get("vllm"), "method": f0.get("method"),
                 "draft_sample_method": f0.get("draft_sample_method"),
                 "rejection_sample_method": f0.get("rejection_sample_method"), "dtype": f0.get("dtype"),
                 "processes": len(facts), **status, "dropped": dropped,
                 "steps_trimmed": int((steps["kept"] < steps["drafted"]).sum()),
                 "requests_with_tokens_from_unrecorded_steps": _unrecorded(steps, reqs),
                 "draft_probabilities": "vLLM's draft_probs" if f0.get("draft_sample_method") == "probabilistic"
                 else "greedy drafting: the drafter proposed its argmax (a point mass), so accept_prob = "
                      "accept_prob_expected = p(token); q_* describe the draft softmax at the request's "
                      "temperature (T=1 when greedy)",
                 "timing": "host wall-clock per engine step (draft_ms: the proposal; verify_ms: forward + "
                           "sampling), shared by the step's batch"},
    }
    if cache is not None:
        if not greedy:
            raise DataError("The engine ran its suffix drafter at temperature > 0; cache drafts and their oracle "
                            "yields are defined on greedy runs (temperature 0).")
        meta["cache"] = {"source": "the engine's own SuffixDecoding proposals (vLLM method `suffix`), one row per "
                                   "request and engine step", "options": f0.get("suffix"),
                         "arctic_inference": f0.get("arctic_inference"), "history": "earlier rows (engine steps)",
                         "model_accepted": f"teacher-forced with the draft {draft} and K = {k}",
                         "rows": cache.height}
        if draft is not None:
            meta["models"]["draft"] = _models({"draft": str(draft)})["draft"]
    meta.update(extra)
    run.mkdir(parents=True)
    write_meta(run, meta)
    order = reqs["request"].to_list()
    for shard, lo in enumerate(range(0, len(order), SHARD_REQUESTS)):
        block = order[lo:lo + SHARD_REQUESTS]
        r = reqs.filter(pl.col("request").is_in(block))
        d = drafts.filter(pl.col("request").is_in(block)).sort("request", "step", "position")
        s = steps.filter(pl.col("request").is_in(block)).sort("request", "step")
        paths = {"drafts": write_shard(run, "drafts", shard, d), "steps": write_shard(run, "steps", shard, s)}
        if cache is not None:
            paths["cache_drafts"] = write_shard(run, "cache_drafts", shard, cache.filter(pl.col("request").is_in(block)))
        paths["requests"] = write_shard(run, "requests", shard, r)
        for table, path in paths.items():
            record_shards(meta, table, [path])
    meta.update({"status": "complete",
                 "finished": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                 "counts": {"requests": reqs.height, "steps": steps.height, "drafts": drafts.height,
                            "labelled": int(drafts["label"].is_not_null().sum()),
                            "accepted": int((drafts["label"] == 1).sum()),
                            "output_tokens": int(reqs["output_ids"].list.len().sum())}})
    write_meta(run, meta)
    open_run(run, deep=True)  # what was written reads back as a valid run
    return meta
