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
import uuid
from pathlib import Path

import polars as pl

from svt.errors import DataError, SchemaError
from svt.traces.io import open_run, record_shards, write_meta, write_shard
from svt.traces.schema import FINISH_REASONS, SCHEMA_VERSION
from svt.vllm_plugin.recorder import SPOOL_SCHEMAS

SHARD_REQUESTS = 4096  # requests per shard of the finished run


OPTIONAL_SPOOL = frozenset({"cache"})  # tables older spools lack (an absent file reads as empty)
# facts every process of one spool must share
SAME_FACTS = ("target", "draft", "method", "k", "draft_sample_method", "rejection_sample_method", "vllm")


def _json_object(path: Path, what: str) -> dict:
    try:
        obj = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: not valid JSON ({exc}).") from None
    except OSError as exc:  # a folder or an unreadable file where a marker should be
        raise DataError(f"{path}: cannot be read as {what} ({exc.strerror or exc}).") from None
    if not isinstance(obj, dict):
        raise DataError(f"{path}: expected a JSON object ({what}), but got {type(obj).__name__}.")
    return obj


def _counts(obj, path: Path, key: str) -> dict:
    if obj is None:
        return {}
    if not isinstance(obj, dict) or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                                            for v in obj.values()):
        raise DataError(f"{path}: `{key}` must map names to counts (integers >= 0), but got {obj!r}.")
    return obj


def read_spool(trace_dir: str | Path) -> tuple[dict[str, pl.DataFrame], list[dict], dict]:
    """The spool's tables (whole flushes only), each process's facts, and the summed counters."""
    root = Path(trace_dir) / "spool"
    if not root.is_dir():
        raise DataError(f"{trace_dir}: no `spool` folder; expected a directory vLLM traced into with "
                        "SVT_TRACE_DIR set.")
    frames: dict[str, list[pl.DataFrame]] = {t: [] for t in SPOOL_SCHEMAS}
    facts, counters, notes = [], {}, {}
    for proc in sorted(p for p in root.iterdir() if p.is_dir()):
        dones = sorted(proc.glob("*.done"))
        if not dones:
            continue
        fact = _json_object(proc / "process.json", "the process's facts") if (proc / "process.json").is_file() else {}
        # a model runner's process says K and the models; an API server's or a scheduler's has only
        # request ids and finished requests
        if "k" in fact:
            k = fact.get("k")
            if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= 64:
                raise DataError(f"{proc / 'process.json'}: `k` must be an integer in [1, 64], but got {k!r}.")
            facts.append(fact)
        runner = "k" in fact
        for done in dones:
            n = done.stem
            marker = _json_object(done, "a flush marker")
            rows = _counts(marker.get("rows"), done, "rows")
            for table, schema in SPOOL_SCHEMAS.items():
                path = proc / f"{n}-{table}.parquet"
                if not path.is_file():
                    if table in OPTIONAL_SPOOL and table not in rows:
                        continue
                    raise DataError(f"{path}: missing, but {done.name} says the flush is whole.")
                if table not in rows:
                    raise DataError(f"{done}: `rows` has no count for `{table}`.")
                try:
                    frame = pl.read_parquet(path)
                except Exception as exc:  # noqa: BLE001 - polars raises several kinds for damaged files
                    raise DataError(f"{path}: not a readable Parquet file ({type(exc).__name__}).") from None
                if dict(frame.schema) != dict(pl.Schema(schema)):
                    raise DataError(f"{path}: columns {dict(frame.schema)} are not the spool's {schema}.")
                if frame.height != rows[table]:
                    raise DataError(f"{path}: {frame.height} rows, but {done.name} recorded {rows[table]}.")
                if table in ("drafts", "steps", "cache") and frame.height and not runner:
                    raise DataError(f"{path}: draft rows from a process whose process.json gives no engine facts "
                                    "(K, models); the spool is damaged.")
                frames[table].append(frame)
            for key, v in _counts(marker.get("counters"), done, "counters").items():
                counters.setdefault(proc.name, {})[key] = v  # cumulative per process: keep the last
            extra = marker.get("notes") or {}
            if not isinstance(extra, dict):
                raise DataError(f"{done}: `notes` must be a JSON object.")
            for key, v in extra.items():
                notes[key] = notes.get(key) or v
    for f in facts:
        for key in ("target", "draft", "method", "vllm", "device", "dtype", "workload"):
            if f.get(key) is not None and not isinstance(f[key], str):
                raise DataError(f"{trace_dir}: a process.json gives `{key}` = {f[key]!r}, not a string; the spool "
                                "is damaged.")
    for key in SAME_FACTS:
        seen = {json.dumps(f.get(key)) for f in facts}
        if len(seen) > 1:
            raise DataError(f"{trace_dir}: its processes disagree on `{key}` ({', '.join(sorted(seen))}): the "
                            "spool mixes different engines' runs. Use one SVT_TRACE_DIR per run.")
    total: dict = {}
    for per_proc in counters.values():
        for key, v in per_proc.items():
            total[key] = total.get(key, 0) + v
    tables = {t: pl.concat(f) if f else pl.DataFrame(schema=SPOOL_SCHEMAS[t]) for t, f in frames.items()}
    return tables, facts, {"counters": total, "notes": notes}


def check_values(tables: dict[str, pl.DataFrame], where) -> None:
    """Values no engine writes: negative token ids, negative or non-finite timings, a sampling
    setting that is not a number, requests of several sampling settings (two server sessions in one
    folder), and labels out of order within a step (a verified draft after a rejected one)."""
    d, st, rq = tables["drafts"], tables["steps"], tables["requests"]

    def fail(what: str, frame: pl.DataFrame) -> None:
        row = frame.row(0, named=True)
        raise DataError(f"{where}: {what} (request {row.get('vllm_request')!r}"
                        + (f", step {row['step']}" if "step" in row else "") + f"; {frame.height} row(s)): the "
                        "spool is damaged.")

    bad = d.filter(pl.col("token") < 0)
    if bad.height:
        fail(f"negative draft token id {bad['token'][0]}", bad)
    for col in ("prompt_ids", "output_ids"):
        bad = rq.filter(pl.col(col).list.eval(pl.element() < 0).list.any())
        if bad.height:
            fail(f"a negative token id in {col}", bad)
    for col, low in (("batch_size", 1), ("drafted", 0), ("accepted", 0), ("emitted", 0), ("kept", 0)):
        bad = st.filter(pl.col(col) < low)
        if bad.height:
            fail(f"{col} = {bad[col][0]} (expected >= {low})", bad)
    for col in ("draft_ms", "verify_ms"):
        bad = st.filter(~pl.col(col).is_finite() | (pl.col(col) < 0))
        if bad.height:
            fail(f"{col} = {bad[col][0]} (a step time must be a finite number >= 0)", bad)
    bad = rq.filter(~pl.col("temperature").is_finite() | (pl.col("temperature") < 0) | ~pl.col("top_p").is_finite()
                    | (pl.col("top_p") <= 0) | (pl.col("top_p") > 1))
    if bad.height:
        fail(f"temperature {bad['temperature'][0]} / top_p {bad['top_p'][0]} (expected T >= 0 and 0 < top_p <= 1)", bad)
    settings = rq.select("temperature", "top_p").unique()
    if settings.height > 1:
        shown = ", ".join(f"T={t:g} top_p={p:g}" for t, p in settings.sort("temperature", "top_p").rows()[:4])
        raise DataError(f"{where}: requests were sampled with {settings.height} settings ({shown}): two server "
                        "sessions in one SVT_TRACE_DIR, or a client that varied them. A run is one sampling "
                        "setting (its labels' meaning depends on it); trace each into its own folder.")
    # within a step, labels read 1 ... 1 [0] then unverified: nothing verified after a rejection
    seq = (d.sort("vllm_request", "step", "position")
           .with_columns((pl.col("label").fill_null(-1) != 1).cast(pl.Int32).alias("_stop"))
           .with_columns((pl.col("_stop").cum_sum().over("vllm_request", "step") - pl.col("_stop")).alias("_before")))
    bad = seq.filter(pl.col("label").is_not_null() & (pl.col("_before") > 0))
    if bad.height:
        fail("a draft verified after a rejected or unverified one in the same step (labels out of order)", bad)


def finish_warnings(meta: dict) -> list[str]:
    """What a finished vLLM run lacks that its counts alone would not tell a reader."""
    v = meta.get("vllm") or {}
    out = []
    lost = v.get("counters", {}).get("unmatched_drafts", 0) + v.get("counters", {}).get("mismatched_drafts", 0)
    if lost and v.get("method") not in ("suffix", "ngram"):
        out.append(f"{lost:,} verified draft(s) could not be paired with their proposal and are not in the run "
                   "(run.json: vllm.counters)")
    unrec = v.get("requests_with_tokens_from_unrecorded_steps") or 0
    if unrec:
        out.append(f"{unrec:,} request(s) have output tokens from steps the spool does not hold (a lost flush, a "
                   "dropped step or a step without drafts): their acceptance is under-counted "
                   "(run.json: vllm.requests_with_tokens_from_unrecorded_steps)")
    for key, n in (v.get("dropped") or {}).items():
        if n:
            out.append(f"dropped {n:,} {key.replace('_', ' ')} (run.json: vllm.dropped)")
    return out


def check_out(trace_dir: str | Path, out: str | Path, overwrite: bool) -> Path:
    """``out`` resolved, refused when it is a file, is not empty and ``overwrite`` is off, is not
    empty and not a run (whatever ``overwrite`` says), or overlaps the spool it would be made from."""
    from svt.traces.rundir import check_run_out

    return check_run_out(out, overwrite, {"the trace directory": Path(trace_dir)})


def finish_spool(trace_dir: str | Path, out: str | Path, *, overwrite: bool = False,
                 order: list[str] | None = None, workloads: dict[str, str] | None = None,
                 meta: dict | None = None, draft: str | Path | None = None, strict: bool = False,
                 verify=None) -> dict:
    """Write the run ``out`` from the spool in ``trace_dir``; return its run.json.

    ``order``: the caller's request ids in svt's request order (``svt collect --engine vllm`` gives
    them); ``workloads``: caller's id -> workload name. ``meta`` is merged into run.json. ``draft``:
    the model drafter whose accepted length labels the engine's suffix drafts (``model_accepted``).
    ``strict``: a model-drafter verification the plugin could not pair with its proposal is an
    error (else it is counted in run.json). ``verify(staged_run)`` runs on the finished run before
    it replaces ``out``; an exception from it leaves ``out`` as it was."""
    out = check_out(trace_dir, out, overwrite)  # fails fast; checked again while the output is held
    tables, facts, status = read_spool(trace_dir)
    reqs = _check_spool(trace_dir, tables, facts, status)
    check_values(tables, trace_dir)
    k = facts[0]["k"]  # one K: read_spool checked the processes agree
    kept = _kept_requests(trace_dir, reqs, tables, facts, order, workloads)
    ids = kept.select("vllm_request", "request", "workload")
    drafts = tables["drafts"].join(ids, on="vllm_request", how="inner")
    steps = tables["steps"].join(ids.drop("workload"), on="vllm_request", how="inner")
    steps, drafts, after_end = _drop_steps_after_end(steps, drafts, kept, bool(facts[0].get("async_scheduling")),
                                                     trace_dir)
    steps = _emitted_into_output(steps, kept)
    cache = None
    if tables["cache"].height:
        from svt.vllm_plugin.cache_rows import cache_rows

        joined = tables["cache"].join(ids, on="vllm_request", how="inner")
        cache = cache_rows(joined, kept.select("request", "prompt_ids", "output_ids"), k,
                           next((f.get("target") for f in facts if f.get("target")), None), draft, trace_dir)
    dropped = {"steps_after_the_output_ended": after_end, "requests_not_finished_or_aborted": reqs.height - kept.height,
               "drafts_of_dropped_requests": tables["drafts"].height - drafts.height}
    _check_consistent(drafts, steps, k, trace_dir)
    model_method = facts[0].get("method") not in ("suffix", "ngram")
    if model_method and steps.height and int(steps["drafted"].max()) != k:
        raise DataError(f"{trace_dir}: process.json says K = {k}, but the drafter proposed at most "
                        f"{int(steps['drafted'].max())} drafts per step.")
    lost = status["counters"].get("unmatched_drafts", 0) + status["counters"].get("mismatched_drafts", 0)
    if strict and model_method and lost:
        raise DataError(f"{trace_dir}: {lost} verified draft(s) could not be paired with the proposal they came "
                        "from (a step the drafter did not run, e.g. past max_model_len); the trace would miss "
                        "them, so no run is written.")

    from svt.traces.rundir import writing

    with writing(out, overwrite=overwrite, inputs={"the trace directory": Path(trace_dir)}) as staged:
        try:
            run_meta = _write(staged, kept, drafts, steps, facts, status, dropped, k, meta or {}, cache, draft)
        except SchemaError as exc:
            raise DataError(f"{trace_dir}: the spool's rows break svt's trace schema: "
                            f"{str(exc).replace(str(staged), 'the run')}") from None
        if verify is not None:
            verify(staged)
    return run_meta


def _check_spool(trace_dir, tables: dict, facts: list, status: dict) -> pl.DataFrame:
    """What makes a spool unusable, each with its reason; return the finished requests."""
    if not facts:
        raise DataError(f"{trace_dir}: no model runner recorded in the spool: none flushed (the engine was killed "
                        "before its first flush) or its runner never reached the plugin's hooks (vLLM's V2 model "
                        "runner, which tracing turns off, or a speculative method the plugin does not hook).")
    if facts[0].get("rejection_sample_method") not in (None, "standard"):
        raise DataError(f"{trace_dir}: the engine ran rejection_sample_method="
                        f"{facts[0]['rejection_sample_method']!r}: its acceptances are not drawn from p and q, so "
                        "the labels would not be acceptance events. Trace with the standard rejection sampler.")
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
    return reqs


def _kept_requests(trace_dir, reqs: pl.DataFrame, tables: dict, facts: list, order, workloads) -> pl.DataFrame:
    """The requests that finished normally, numbered in the caller's order (else the spool's),
    with the caller's ids and workloads."""
    # the caller's ids (vLLM appends a random suffix to each)
    ext = dict(zip(tables["ids"]["internal"].to_list(), tables["ids"]["external"].to_list(), strict=True))
    reqs = reqs.with_columns(pl.col("vllm_request").replace_strict(ext, default=pl.col("vllm_request"))
                             .alias("external"))
    kept = reqs.filter(pl.col("finish_reason").is_in(list(FINISH_REASONS)))
    if kept.height == 0:
        raise DataError(f"{trace_dir}: no request finished normally (stop or length); finish reasons seen: "
                        f"{sorted(set(reqs['finish_reason'].to_list()))}.")
    if order is not None:
        rank = {e: i for i, e in enumerate(order)}
        finished = set(kept["external"].to_list())
        missing = [e for e in order if e not in finished]
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
    return kept


def _drop_steps_after_end(steps: pl.DataFrame, drafts: pl.DataFrame, reqs: pl.DataFrame, async_scheduling: bool,
                          where):
    """Steps that began once the request's output was complete. Under async scheduling vLLM verifies
    a finished request once more before it learns it finished: that one step's tokens went nowhere
    and its context is not in the output, so it and its drafts are dropped (and counted). Any other
    such step means the requests table and the steps disagree: an error."""
    budget = reqs.select("request", (pl.col("output_ids").list.len() - 1).clip(lower_bound=0).alias("_budget"))
    s = (steps.sort("request", "step").join(budget, on="request", how="left")
         .with_columns((pl.col("emitted").cast(pl.Int32).cum_sum().over("request") - pl.col("emitted"))
                       .alias("_before")))
    late = s.filter(pl.col("_before") >= pl.col("_budget")).select("request", "step")
    if late.height == 0:
        return steps, drafts, 0
    per = late.group_by("request").len()
    if not async_scheduling or int(per["len"].max()) > 1:
        r = per.sort("len", descending=True).row(0, named=True)
        raise DataError(f"{where}: request {r['request']}: {r['len']} step(s) began after its output ended "
                        f"({'more than the one async scheduling adds' if async_scheduling else 'the engine ran without async scheduling'}); "
                        "the requests table does not match the steps (a damaged spool).")
    return (steps.join(late, on=["request", "step"], how="anti"), drafts.join(late, on=["request", "step"], how="anti"),
            late.height)


def _emitted_into_output(steps: pl.DataFrame, reqs: pl.DataFrame) -> pl.DataFrame:
    """``emitted``: the tokens of the output each step produced. vLLM's sampler emits accepted + 1
    tokens, but the scheduler drops those past a stop token or max_tokens at a request's last step;
    and the first output token comes from the prefill, not from a verification step."""
    budget = reqs.select("request", (pl.col("output_ids").list.len() - 1).clip(lower_bound=0).alias("_budget"))
    out = (steps.sort("request", "step").join(budget, on="request", how="left")
           .with_columns(pl.col("emitted").cast(pl.Int32).cum_sum().over("request").alias("_cum"),
                         (pl.col("step") == pl.col("step").max().over("request")).alias("_last"))
           .with_columns(pl.min_horizontal(pl.col("emitted").cast(pl.Int32),
                                           (pl.col("_budget") - pl.col("_cum") + pl.col("emitted")).clip(lower_bound=0))
                         .cast(pl.Int16).alias("_e")))
    cut = out.filter(~pl.col("_last") & (pl.col("_e") != pl.col("emitted")))
    if cut.height:
        raise DataError(f"request {cut['request'][0]}: its output is shorter than what its steps before the last "
                        "emitted; the requests table does not match the steps (a damaged spool).")
    return out.with_columns(pl.col("_e").alias("emitted")).drop("_budget", "_cum", "_last", "_e")


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
