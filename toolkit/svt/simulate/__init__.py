"""End-to-end simulation: cost tables and the Adaptive Verification replay."""

from __future__ import annotations

import numpy as np
import polars as pl

from svt.errors import DataError
from svt.simulate.av import CONCURRENCY, StepTrace, mark_pareto, replay
from svt.simulate.cost_files import load_costs
from svt.simulate.costs import CostTable


def run_schedule(metas: list[dict]) -> str:
    """The schedule the replay models for these runs: continuous when every run was collected with
    continuous batching (run.json ``schedule.kind``), else static (the batches of every earlier run)."""
    kinds = {(m.get("schedule") or {}).get("kind", "static") for m in metas}
    return "continuous" if kinds == {"continuous"} else "static"


def run_verification(metas: list[dict]) -> str:
    """How the replay charges a step whose rows keep different numbers of drafts: padded when every
    run says its engine pads (run.json ``verification``: svt's engine), else packed."""
    kinds = {m.get("verification", "packed") for m in metas}
    return "padded" if kinds == {"padded"} else "packed"


def build_trace(drafts: pl.DataFrame, confidences: dict[str, str], keys=("_run", "request"),
                schedule: str = "static", verification: str = "packed",
                outputs: pl.DataFrame | None = None) -> StepTrace:
    """Request-steps from a drafts frame: accepted runs from the labels and, per predictor, the K
    confidences (a column of ``drafts`` per name). Steps with fewer than K drafts get confidence 0
    for the missing positions. ``schedule``: how the replay batches the requests (``StepTrace``).
    ``outputs`` (``keys`` and ``tokens``): how many tokens each request decoded, the length every
    policy's replay of it runs to; a request of the drafts it lacks, or one of no tokens, is
    refused, and so is a request it names twice."""
    k = int(drafts["position"].max()) + 1
    cols = list(confidences.values())
    per = (drafts.sort([*keys, "step", "position"])
           .group_by([*keys, "step"], maintain_order=True)
           .agg((pl.col("label") == 1).sum().alias("a"), pl.col("position"),
                *[pl.col(c).cast(pl.Float64) for c in cols]))
    req = per.select(pl.struct(*keys).rank("dense").sub(1)).to_series().to_numpy()
    conf = {}
    lengths = per["position"].list.len().to_numpy()
    step_of = np.repeat(np.arange(per.height), lengths)  # each draft's request-step
    position = per["position"].explode().to_numpy()
    for name, col in confidences.items():
        m = np.zeros((per.height, k))
        values = per[col].explode()
        if values.len() != position.size:
            raise DataError(f"Predictor {name!r}: {values.len()} confidences for {position.size} drafts.")
        m[step_of, position] = values.fill_null(np.nan).to_numpy()
        if not np.isfinite(m).all():
            raise DataError(f"Predictor {name!r} has missing confidences in the simulated rows.")
        conf[name] = m
    budget = None
    if outputs is not None:
        if outputs.select(*keys).is_duplicated().any():
            raise DataError("The runs' steps give one request two output lengths: a damaged or merged steps table.")
        ids = (per.select(*keys).with_columns(pl.Series("_r", req)).unique(subset="_r")
               .join(outputs.select(*keys, "tokens"), on=list(keys), how="left").sort("_r"))
        bad = ids.filter(pl.col("tokens").is_null() | (pl.col("tokens") < 1))
        if bad.height:
            raise DataError(f"{bad.height} request(s) of the drafts have no decoded tokens recorded (first: "
                            f"{dict(zip(keys, bad.row(0)[:len(keys)], strict=True))}): the run's steps table "
                            "does not match its drafts.")
        budget = ids["tokens"].to_numpy().astype(np.float64)
    return StepTrace(req.astype(np.int64), per["step"].to_numpy().astype(np.int64),
                     per["a"].to_numpy().astype(np.int64), k, conf, schedule, verification, budget)


__all__ = ["CONCURRENCY", "CostTable", "StepTrace", "build_trace", "load_costs", "mark_pareto", "replay",
           "run_schedule", "run_verification"]
