"""Live runs against the replay: what the engine delivered beside what the replay predicts for the
same policy at the same batch size, and what the difference is made of.

For each live run (any policy svt's engine runs: fixed K, K = 0 plain decoding, live AV, live HVD),
from its ``schedule`` table (one row per engine step):

- **measured**: decode tokens/s = tokens emitted / the steps' wall-clock (``step_ms``: draft, verify,
  acceptance, bookkeeping, cache compaction); the prefill of admitted requests is timed apart and
  left out, as are loading and writing the run;
- **predicted**: the replay's point for the same policy and batch size on the evaluated trace (none
  for live HVD: the AV replay has no HVD policy, and HVD's own replay prices cycles at batch 1; its
  row stands among the live points, priced step by step by the table);
- **the parts of the ratio**: tokens per request-step (the replay's against the live run's:
  acceptance and the schedule), and the live run's own steps priced by the cost table:
  ``table / steps`` (the table's whole price of each step, ``step_ms`` included, over the steps'
  wall-clock: 1 when the table prices the engine's steps right, whatever the policy's tokens),
  ``table / forwards`` (its forward cells alone over the time inside the steps' model forwards,
  ``forward_ms``; the draft and verify phases for runs logged before it) and
  ``step / forwards`` (the engine's work outside its forwards);
- **the ratio at the run's speed**: the ratio with the table's forward cells rescaled by the run's
  own forwards (``forwards / table's price of them``, one factor a run), its ``step_ms`` kept: on a
  host whose speed drifts between the profile and the run (measured on a 2-core VM: 2x within
  minutes), this separates the host's drift from what the replay's model gets wrong (none for runs
  logged before ``forward_ms``, whose draft and verify phases hold sampling and acceptance too);
- **the cache width** its verify forwards attended (mean ``verify_slots``: each row is padded to the
  longest row and keeps masked holes until a compaction), beside the context the cost table's
  cells held (a profile of a collection's config holds, at each batch size, the width the engine
  attended on its prompts): a forward attending more slots costs more (measured on the demo pair,
  batch 16, 4 tokens a row: 9.4 ms at 507 slots against 8.7 ms at 418).

Several live runs of the same policy and batch size (rounds) get their median and range.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from svt.errors import DataError
from svt.traces.io import open_run


def live_policy(meta: dict, path: str, fits: list[str], fit_names: list[str]) -> str:
    """The replay policy a live run ran: ``fixed K=k``, or ``AV <predictor>`` for a live-AV run
    whose fit is among ``fits`` (``fit_names``: their predictor names in the replay)."""
    if (meta.get("hvd") or {}).get("live"):
        return f"live HVD tau={meta['hvd']['tau']:g}"
    av = meta.get("av")
    if not av:
        return f"fixed K={int(meta['k'])}"
    want = Path(av["fit"]).resolve()
    match = [i for i, f in enumerate(fits) if Path(f).resolve() == want]
    if not match:
        raise DataError(f"{path} trimmed with {av['fit']}; pass that fit with --fit to replay it.")
    suffix = " [engine rule]" if av.get("rule", "engine") == "engine" else ""
    if av.get("length"):
        if suffix:
            raise DataError(f"{path}: AV+length with the engine rule has no replay policy (the replay's AV+length "
                            "uses the lossless rule).")
        return f"AV+length {fit_names[match[0]]}"
    return f"AV {fit_names[match[0]]}{suffix}"


def read_live(path: str, fits: list[str], fit_names: list[str]) -> dict:
    """A live run's measured decode figures and its own steps (for pricing them with a cost table)."""
    run = open_run(path)
    meta = run.meta
    engine = (meta.get("config") or {}).get("engine", "svt")
    hvd = meta.get("hvd")
    if engine not in ("svt", "hvd") or (hvd and not hvd.get("live")) or meta.get("import"):
        raise DataError(f"{path}: not a run of svt's batched engine or of live HVD (a tree, imported or other "
                        "engine's run): --live compares those engines' runs with the replay.")
    if not run.has("schedule"):
        raise DataError(f"{path}: has no `schedule` table (collected before svt logged its engine steps): "
                        "collect it again to compare it live.")
    if (meta.get("schedule") or {}).get("resumed"):
        raise DataError(f"{path}: resumed after an interruption, so its engine steps ran in two sessions (and the "
                        "first one's served requests it redid): collect it again in one session to compare it live.")
    sched = run.scan("schedule").collect()
    if sched.height == 0:
        raise DataError(f"{path}: its `schedule` table is empty.")
    if meta.get("shard") is not None:
        raise DataError(f"{path}: one shard of a collection; its steps ran beside other processes. Compare a "
                        "whole run.")
    steps = run.scan("steps").select(pl.len().alias("rows"), pl.col("emitted").sum().alias("tokens")).collect()
    per_tick = sched.select(pl.col("batch_size").cast(pl.Int64).sum().alias("rows"),
                            pl.col("emitted").cast(pl.Int64).sum().alias("tokens"))
    if steps.row(0) != per_tick.row(0):
        raise DataError(f"{path}: its `schedule` table ({per_tick['rows'][0]:,} rows decoded, {per_tick['tokens'][0]:,} "
                        f"tokens) disagrees with its `steps` table ({steps['rows'][0]:,} request-steps, "
                        f"{steps['tokens'][0]:,} tokens): the tables are not one run's.")
    # the forwards as timed inside the steps (runs before forward_ms: the draft and verify phases,
    # their sampling and acceptance test included)
    fwd = pl.col("forward_ms") if "forward_ms" in sched.columns else pl.col("draft_ms") + pl.col("verify_ms")
    s = sched.select(
        pl.col("step_ms").sum().alias("step"), fwd.sum().alias("fwd"),
        pl.col("prefill_ms").sum().alias("prefill"), pl.col("emitted").sum().alias("tokens"),
        pl.col("batch_size").sum().alias("rows"), pl.col("batch_size").mean().alias("mean_batch"),
        pl.len().alias("steps")).row(0, named=True)
    # the context the verify forwards attended (runs logged before verify_slots: unknown)
    width = float(sched["verify_slots"].mean()) if "verify_slots" in sched.columns else None
    cfg = meta.get("config") or {}
    kind = (meta.get("schedule") or {}).get("kind", "static")
    # while requests wait (a continuous run, the steps before its last admission: each had a request
    # left to admit once its slots were filled): the steady state the replay models; from the last
    # admission on the batch drains as the last requests finish
    last = sched.filter(pl.col("admitted") > 0)["tick"].max() if kind == "continuous" else None
    before = None if last is None else sched.filter(pl.col("tick") < last)["batch_size"]
    waiting = float(before.mean()) if before is not None and before.len() else None
    return {
        "run": str(path), "policy": live_policy(meta, path, fits, fit_names), "k": int(meta["k"]),
        "batch_size": int(cfg.get("batch_size", 0)), "schedule": (meta.get("schedule") or {}).get("kind", "static"),
        "device": meta.get("device"), "decode_s": s["step"] / 1e3, "prefill_s": s["prefill"] / 1e3,
        "forwards_s": s["fwd"] / 1e3, "forwards_timed": "forward_ms" in sched.columns,
        "tokens": int(s["tokens"]), "engine_steps": int(s["steps"]),
        "mean_batch": float(s["mean_batch"]), "waiting_mean_batch": waiting, "cache_width": width,
        "live_tokens_per_s": s["tokens"] / (s["step"] / 1e3) if s["step"] > 0 else None,
        "live_tokens_per_step": s["tokens"] / s["rows"],
        "live_interactivity": _interactivity(run, sched, kind, int(cfg.get("batch_size", 1))),
        "_steps": sched.select("batch_size", "verify_tokens", "draft_passes").to_numpy().astype(np.int64),
    }


def _interactivity(run, sched: pl.DataFrame, kind: str, batch_size: int) -> float:
    """Mean over requests of tokens / the wall-clock of the engine steps it decoded in. A continuous
    run's steps are its engine ticks; a static run's ticks count from 0 in each batch's shard
    (``part-b``: requests b * B .. b * B + B - 1), and a request decodes in its batch's ticks up to
    its last step."""
    from svt.traces.io import SHARD_RE, scan_shard

    steps = run.scan("steps").select("request", "step", "emitted").collect()
    if kind == "continuous":
        per = steps.join(sched.select(pl.col("tick").alias("step"), "step_ms"), on="step", how="left")
    else:
        parts = [scan_shard(f, "schedule").select(pl.lit(int(SHARD_RE.fullmatch(f.name).group(1))).alias("_batch"),
                                                  pl.col("tick").alias("step"), "step_ms")
                 for f in run.shards["schedule"]]
        per = steps.with_columns((pl.col("request") // batch_size).alias("_batch")).join(
            pl.concat(parts).collect(), on=["_batch", "step"], how="left")
    if per["step_ms"].null_count():
        raise DataError(f"{run.path}: steps whose engine step is not in its `schedule` table.")
    r = per.group_by("request").agg(pl.col("emitted").sum(), pl.col("step_ms").sum())
    return float((r["emitted"] / (r["step_ms"] / 1e3)).mean())


def priced_seconds(steps: np.ndarray, costs, with_step: bool = True) -> float:
    """The cost table's price of a run's own engine steps (``[batch, verify tokens, draft passes]``
    each): the whole step, or (``with_step=False``) its forward cells alone, without ``step_ms``."""
    total = 0.0
    for b, tokens, k in steps.tolist():
        total += costs.draft(b, k) + float(costs.verify(int(tokens), rows=b))
        if not with_step:
            total -= costs.step_overhead(b, k)
    return total / 1e3


def compare_live(lives: list[dict], points: list[dict], costs) -> dict:
    """Each live run beside the replay's point for its policy and batch size, and the rounds of
    one point summarised (median and range)."""
    by_key = {(p["policy"], int(p["concurrency"])): p for p in points}
    rows = []
    for live in lives:
        steps = live.pop("_steps")
        point = by_key.get((live["policy"], live["batch_size"]))
        if point is None and live["policy"].startswith("live HVD"):  # among the live points, unreplayed
            point = {"throughput": None, "tokens_per_step": None}
        elif point is None:
            raise DataError(f"{live['run']}: the replay has no point for {live['policy']} at B = {live['batch_size']} "
                            "(a K above the evaluated run's?).")
        priced = priced_seconds(steps, costs)
        priced_fwd = priced_seconds(steps, costs, with_step=False)
        measured = live["live_tokens_per_s"]
        fwd = live["forwards_s"] or None
        thr = point["throughput"]
        ratio = float(thr) / measured if measured and thr is not None else None
        rows.append({**live, "replay_tokens_per_s": None if thr is None else float(thr),
                     "replay_tokens_per_step": None if thr is None else float(point["tokens_per_step"]),
                     # the replay's occupancy on the policy's own request-steps (None: a point without it)
                     "replay_mean_batch": None if point.get("mean_batch") is None else float(point["mean_batch"]),
                     "ratio": ratio,
                     # the table's forward cells brought to the speed the host ran this run's forwards at
                     # (priced_fwd -> fwd), its step_ms kept: what is left is the model's, not the host's
                     "ratio_at_run_speed": ratio * priced / (fwd + priced - priced_fwd)
                     if ratio is not None and fwd and live.get("forwards_timed", True) else None,
                     "table_s": priced, "table_vs_steps": priced / live["decode_s"] if live["decode_s"] else None,
                     "table_vs_forwards": priced_fwd / fwd if fwd else None,
                     "step_vs_forwards": live["decode_s"] / fwd if fwd else None})
    rounds = []
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["policy"], r["batch_size"]), []).append(r)
    for (policy, b), rs in groups.items():
        def stat(key, rs=rs):
            v = np.array([r[key] for r in rs if r[key] is not None], dtype=np.float64)
            return None if not v.size else {"median": float(np.median(v)), "min": float(v.min()),
                                            "max": float(v.max())}
        rounds.append({"policy": policy, "batch_size": b, "rounds": len(rs), "ratio": stat("ratio"),
                       "ratio_at_run_speed": stat("ratio_at_run_speed"),
                       "live_tokens_per_s": stat("live_tokens_per_s"), "replay_tokens_per_s": stat("replay_tokens_per_s"),
                       "table_vs_steps": stat("table_vs_steps"), "table_vs_forwards": stat("table_vs_forwards"),
                       "step_vs_forwards": stat("step_vs_forwards"),
                       "mean_batch": stat("mean_batch"), "waiting_mean_batch": stat("waiting_mean_batch"),
                       "replay_mean_batch": stat("replay_mean_batch")})
    context = (getattr(costs, "measurement", None) or {}).get("context")
    return {"runs": rows, "points": rounds, "profiled_context": context,
            "note": "decode tokens/s: tokens emitted over the engine steps' wall-clock (prefill, loading and "
                    "writing excluded; prefill reported apart). ratio = replay / live; at the run's speed: the same "
                    "ratio with the table's forward cells rescaled to this run's own forwards as timed (the "
                    "host's speed while it ran; the table's step_ms kept), so what is left is the replay's model "
                    "(schedule, acceptance, the engine's work outside its forwards), not the host's drift "
                    "between profile and run. table / steps: the cost "
                    "table's whole price of the live run's own steps over their wall-clock; table / forwards: "
                    "its forward cells alone over the forwards as timed; step / forwards: whole steps over "
                    "their forwards (the engine's work outside them). cache width: the mean slots a row's verify "
                    "forward attended (padding to the longest row and holes included)"
                    + (f"; the cost table's cells held {_context_text(context)} slots." if context else ".")}


def _context_text(context) -> str:
    """A profile's context: one figure (older tables), or one per batch size (the engine's width)."""
    if isinstance(context, dict):
        return ", ".join(f"{c} at B = {b}" for b, c in sorted(context.items(), key=lambda kv: int(kv[0])))
    return str(context)
