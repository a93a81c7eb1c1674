"""Studies built on the fitters: one fit per group (workload, draft model, ...)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl

from svt.errors import DataError
from svt.fit import fit_runs, load_drafts_for_fit


def fit_by_group(runs: list[str | Path], model: str, by: str, out_dir: str | Path, **kwargs) -> dict:
    """Fit ``model`` separately per value of the drafts column ``by``; save OUT/<value>.json and
    OUT/summary.json with each group's slope, first intercept, acceptance and mean draft entropy,
    and the correlations of slope and first intercept with the entropy (3+ groups)."""
    from svt.errors import ConfigError
    from svt.fit import get_fitter

    if get_fitter(model).table != "drafts":
        raise ConfigError(f"--by fits acceptance predictors per group; {model!r} is fitted on cache drafts "
                          "(use `svt evaluate --by workload` to see a yield fit per workload).")
    drafts, _ = load_drafts_for_fit(runs)
    if by not in drafts.columns:
        raise DataError(f"Cannot fit by {by!r}: the drafts table has no such column.")
    out_dir = Path(out_dir)
    rows = []
    for value in sorted(drafts[by].unique().to_list(), key=str):
        fit = fit_runs(runs, model, where=pl.col(by) == value, **kwargs)
        fit.save(out_dir / f"{value}.json")
        coef = fit.to_dict()
        part = drafts.filter((pl.col(by) == value) & pl.col("label").is_not_null())
        slope = coef.get("slope")
        rows.append({"group": value, "labelled": part.height, "acceptance": float(part["label"].mean()),
                     "mean_entropy": float(part["q_entropy"].mean()),
                     "slope": float(np.mean(slope)) if slope is not None else float("nan"),
                     "first_intercept": float(coef.get("intercepts", [float("nan")])[0])})
    summary = {"model": model, "by": by, "groups": rows}
    if len(rows) >= 3:
        ent = np.array([r["mean_entropy"] for r in rows])
        for key, col in (("r_slope_entropy", "slope"), ("r_intercept_entropy", "first_intercept")):
            v = np.array([r[col] for r in rows])
            summary[key] = float(np.corrcoef(ent, v)[0, 1]) if np.std(v) > 0 and np.std(ent) > 0 else None
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary
