"""A cost model fitted to a profile's repeats, not a table of medians.

One noisy cell of raw medians moved the replay's budget rule, and made the whole table look
unreliable on a quiet machine. What the replay reads is now a monotone, physically shaped fit:

- **verify**: time as a function of the rows of one target forward and the tokens a row, fitted by
  bivariate isotonic regression (non-decreasing in both: more rows or more tokens never cost less)
  of the cells' medians (one slow repeat, a scheduler tick, moves no cell), weighted by repeats. Rows matter on their own, not only
  through the tokens: each row reads its own KV cache, so 64 rows of 1 token cost more than 16
  rows of 4 (10.6 against 6.2 ms on the demo's CPU pair); a model in total tokens alone missed
  those cells by 35 %;
- **draft**: the cumulative time of k drafts for a batch, fitted the same way over (batch, k): a
  larger batch never drafts faster, and k + 1 drafts never take less than k. (An affine model in k
  with each part made monotone in the batch was tried first: the first draft, a catch-up forward
  over k + 1 slots for a hidden-state head, sits 5-8 % off the line, and making the two parts
  monotone separately lifted a whole batch row 15 % above its measurements.)

Beside the fitted table go the raw medians, each cell's relative residual (median / fit - 1), a
bootstrap interval of every fitted value (repeats resampled within each cell, the fit redone), and
``REPLICATES`` of those refits whole: the replays run again on each, so a figure carries the
interval the cost model's uncertainty puts on it.

Cells whose residual is above ``MAX_RESIDUAL`` or whose 95 % interval reaches further than
``MAX_UNCERTAINTY`` are measured again by the profiler, and those still so are *noted*
(:func:`fit_notes`), not flagged: measured ten times on a quiet 2-core machine, the widest
interval of a profile was 10-40 % and its largest residual 6-17 %, so a table flagged at 10 % was
flagged nine times in ten on a quiet machine, and the flag told a user nothing. What a user acts
on is whether the replay's *winner* changes across the refits (``svt.simulate.av.decision_audit``:
every report says so, naming the cells). The table itself is flagged (:func:`fit_warnings`) when
the machine was busy: a residual above ``BUSY_RESIDUAL`` or an interval beyond ``BUSY_UNCERTAINTY``
(a machine busy on and off: 310 % seen with two processes spinning), fewer than ``MIN_REPEATS``
repeats a cell, or (judged by the profiler) other processes' load.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import isotonic_regression

MAX_RESIDUAL = 0.10  # a cell's median off the fit by more than this share: measured again, then noted
MAX_UNCERTAINTY = 0.10  # a fitted value's 95 % interval half-width over the value above this: likewise
BUSY_RESIDUAL = 0.25  # the table flagged: a quiet machine's largest residual was 6-17 % in ten profiles
BUSY_UNCERTAINTY = 0.50  # likewise: a quiet machine's widest interval was 10-40 %
MIN_REPEATS = 5
BOOTSTRAP = 200
REPLICATES = 40  # bootstrap refits kept in the table: the replays re-run on each for the cost interval


def bimonotone(y: np.ndarray, w: np.ndarray, *, tol: float = 1e-12, max_iter: int = 10_000) -> np.ndarray:
    """The weighted least-squares fit to the grid ``y`` [rows, cols] that is non-decreasing along
    both axes: Dykstra's alternating projections onto the two cones (each a weighted isotonic
    regression per row, then per column, in the same weighted norm), to convergence."""
    x, p, q = y.astype(float), np.zeros_like(y, float), np.zeros_like(y, float)
    for _ in range(max_iter):
        a = x + p
        z = np.array([isotonic_regression(a[i], weights=w[i]).x for i in range(a.shape[0])])
        p = a - z
        b = z + q
        new = np.array([isotonic_regression(b[:, j], weights=w[:, j]).x for j in range(b.shape[1])]).T
        q = b - new
        if np.max(np.abs(new - x)) <= tol * max(1.0, float(np.max(np.abs(new)))):
            return new
        x = new
    return x


def fit_verify(samples: dict[tuple[int, int], list[float]]) -> dict[int, dict[int, float]]:
    """``samples[(batch, tokens a row)]``: repeats in ms (a full grid) -> fitted
    ``verify[batch][tokens a row]``, non-decreasing in both: the weighted least-squares fit to the
    cells' medians, each weighted by its repeats."""
    batches = sorted({b for b, _ in samples})
    widths = sorted({m for _, m in samples})
    missing = [(b, m) for b in batches for m in widths if (b, m) not in samples]
    if missing:
        raise ValueError(f"the verify profile is not a full grid: no repeats at (batch, tokens a row) {missing[:3]}")
    y = np.array([[np.median(samples[(b, m)]) for m in widths] for b in batches])  # one slow repeat moves no cell
    w = np.array([[len(samples[(b, m)]) for m in widths] for b in batches], float)
    z = bimonotone(y, w)
    return {b: {m: float(z[i, j]) for j, m in enumerate(widths)} for i, b in enumerate(batches)}


def fit_draft(samples: dict[int, np.ndarray]) -> dict[int, dict[int, float]]:
    """``samples[batch]``: cumulative ms after each of k drafts, one row per repeat -> fitted
    ``draft_ms[batch][k]``, non-decreasing in the batch and in k: the weighted least-squares fit to
    the cells' medians, each weighted by its repeats (as :func:`fit_verify`)."""
    batches = sorted(samples)
    y = np.array([np.median(np.asarray(samples[b], float), axis=0) for b in batches])
    w = np.array([[len(samples[b])] * y.shape[1] for b in batches], float)
    z = bimonotone(y, w)
    return {b: {j + 1: float(z[i, j]) for j in range(z.shape[1])} for i, b in enumerate(batches)}


def _resample(samples: dict, rng: np.random.Generator) -> dict:
    out = {}
    for key, s in samples.items():
        a = np.asarray(s, float)
        out[key] = a[rng.integers(0, len(a), len(a))]
    return out


def _round(x: float) -> float:
    return round(float(x), 4)


def _interval(draws) -> list[float]:
    return [_round(np.percentile(draws, 2.5)), _round(np.percentile(draws, 97.5))]


def _half_width(draws, value: float) -> float:
    """The larger distance from a fitted value to its 95 % interval's ends, over the value."""
    if not draws or value <= 0:
        return 0.0
    lo, hi = np.percentile(draws, [2.5, 97.5])
    return float(max(value - lo, hi - value) / value)


def fit_costs(draft: dict[int, np.ndarray], verify: dict[tuple[int, int], list[float]], *, seed: int = 0,
              bootstrap: int = BOOTSTRAP, replicates: int = REPLICATES) -> tuple[dict, dict, dict]:
    """The fitted ``draft_ms[batch][k]`` and ``verify[batch][tokens a row]`` of a profile's repeats,
    and the fit's record: raw medians, relative residuals (per cell and the largest), 95 %
    bootstrap intervals of the fitted values, the first ``replicates`` bootstrap refits (whole
    tables, for the replays' cost intervals) and the repeats."""
    draft_fit, verify_fit = fit_draft(draft), fit_verify(verify)
    raw_draft = {b: {j + 1: float(v) for j, v in enumerate(np.median(np.asarray(r, float), axis=0))}
                 for b, r in draft.items()}
    raw_verify: dict[int, dict[int, float]] = {}
    for (b, m), s in sorted(verify.items()):
        raw_verify.setdefault(b, {})[m] = float(np.median(s))
    res_draft = {b: {j: raw_draft[b][j] / draft_fit[b][j] - 1 for j in row} for b, row in draft_fit.items()}
    res_verify = {b: {m: raw_verify[b][m] / verify_fit[b][m] - 1 for m in row} for b, row in verify_fit.items()}
    rng = np.random.default_rng(seed)
    boot_d = {b: {j: [] for j in row} for b, row in draft_fit.items()}
    boot_v = {b: {m: [] for m in row} for b, row in verify_fit.items()}
    kept = []
    for i in range(bootstrap):
        d, v = fit_draft(_resample(draft, rng)), fit_verify(_resample(verify, rng))
        for b, row in d.items():
            for j, x in row.items():
                boot_d[b][j].append(x)
        for b, row in v.items():
            for m, x in row.items():
                boot_v[b][m].append(x)
        if i < replicates:
            kept.append({"draft_ms": {b: {j: _round(x) for j, x in row.items()} for b, row in d.items()},
                         "verify_rows_ms": {b: {m: _round(x) for m, x in row.items()} for b, row in v.items()}})
    cells = [x for row in res_draft.values() for x in row.values()] + [x for row in res_verify.values()
                                                                      for x in row.values()]
    record = {
        "model": "verify: isotonic in rows and in tokens a row; draft: isotonic in batch and in k (cumulative)",
        "repeats": min([len(r) for r in draft.values()] + [len(s) for s in verify.values()], default=0),
        "max_residual": _round(max((abs(x) for x in cells), default=0.0)),
        "max_uncertainty": _round(max([_half_width(boot_d[b][j], x) for b, row in draft_fit.items() for j, x in row.items()]
                                      + [_half_width(boot_v[b][m], x) for b, row in verify_fit.items()
                                         for m, x in row.items()], default=0.0)),
        "raw_draft_ms": {b: {j: _round(x) for j, x in row.items()} for b, row in raw_draft.items()},
        "raw_verify_rows_ms": {b: {m: _round(x) for m, x in row.items()} for b, row in raw_verify.items()},
        "residuals": {"draft": {b: {j: _round(x) for j, x in row.items()} for b, row in res_draft.items()},
                      "verify": {b: {m: _round(x) for m, x in row.items()} for b, row in res_verify.items()}},
        "uncertainty": {"draft": {b: {j: _round(_half_width(boot_d[b][j], x)) for j, x in row.items()}
                                  for b, row in draft_fit.items()},
                        "verify": {b: {m: _round(_half_width(boot_v[b][m], x)) for m, x in row.items()}
                                   for b, row in verify_fit.items()}},
        "interval95": {"draft": {b: {j: _interval(x) for j, x in row.items()} for b, row in boot_d.items()},
                       "verify": {b: {m: _interval(x) for m, x in row.items()} for b, row in boot_v.items()}},
        "replicates": kept,
    }
    return draft_fit, verify_fit, record


def fit_warnings(record: dict) -> list[str]:
    """Why a fitted profile is not to be trusted (empty: it is)."""
    out = []
    if record["max_residual"] > BUSY_RESIDUAL:
        out.append(f"the cost model misses a measured cell by {record['max_residual']:.0%} (more than "
                   f"{BUSY_RESIDUAL:.0%}): the times do not follow the model, as on a busy machine, or a cost "
                   "depends on more than the model's inputs (measurement.fit.residuals says which cells)")
    if record.get("max_uncertainty", 0.0) > BUSY_UNCERTAINTY:
        out.append(f"the cost model's 95 % interval reaches {record['max_uncertainty']:.0%} from a fitted value (more "
                   f"than {BUSY_UNCERTAINTY:.0%}): the repeats scatter too much to pin the costs down, as on a busy "
                   "machine (measurement.fit.interval95 says which cells)")
    if record["repeats"] < MIN_REPEATS:
        out.append(f"{record['repeats']} repeats per cell, fewer than {MIN_REPEATS}: too few to fit")
    return out


def fit_notes(record: dict) -> list[str]:
    """The cells the fit pins less well than ``MAX_RESIDUAL`` / ``MAX_UNCERTAINTY`` (information:
    whether they matter is the replay's decision audit's to say)."""
    out = []
    for key, limit, what, fmt in (("residuals", MAX_RESIDUAL, "off the fit by more than", "{:+.0%}"),
                                  ("uncertainty", MAX_UNCERTAINTY, "with a 95 % interval reaching further than",
                                   "±{:.0%}")):
        cells = [f"{kind}[{b}][{j}] {fmt.format(x)}" for kind, rows in (record.get(key) or {}).items()
                 for b, row in rows.items() for j, x in row.items() if abs(x) > limit]
        if cells:
            out.append(f"cells {what} {limit:.0%}: {', '.join(cells[:8])}"
                       + (f" and {len(cells) - 8} more" if len(cells) > 8 else ""))
    return out
