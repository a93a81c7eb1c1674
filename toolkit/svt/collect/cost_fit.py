"""A cost model fitted to a profile's repeats, not a table of medians.

One noisy cell of raw medians moved the replay's budget rule, and made the whole table look
unreliable on a quiet machine. What the replay reads is now a monotone, physically shaped fit:

- **verify**: time as a function of the tokens of one target forward (rows x tokens a row), fitted
  by isotonic regression (non-decreasing in tokens: more tokens never cost less) over every repeat
  of every cell, each repeat weighted equally;
- **draft**: per batch, the time of k drafts is an affine function of k (a fixed part, the first
  draft's extra work included, plus a per-draft step), fitted by non-negative least squares over the
  repeats; the fixed part and the step are then made non-decreasing in the batch (isotonic in the
  batch, weighted by repeats), so a larger batch never drafts faster.

Beside the fitted table go the raw medians, each cell's relative residual (median / fit - 1), and a
bootstrap interval of every fitted value (repeats resampled within each cell, the fit redone). The
profile is unreliable when the *fit* is: a residual above ``MAX_RESIDUAL``, or fewer than
``MIN_REPEATS`` repeats per cell (a busy machine is judged by its load, as before), not when one
raw cell is noisy.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import nnls
from sklearn.isotonic import IsotonicRegression

MAX_RESIDUAL = 0.10  # a cell's median off the fit by more than this share: the fit does not describe it
MIN_REPEATS = 5
BOOTSTRAP = 200


def fit_verify(samples: dict[tuple[int, int], list[float]]) -> dict[int, float]:
    """``samples[(batch, tokens a row)]``: repeats in ms -> fitted ms per total tokens (batch x
    tokens), non-decreasing."""
    xs, ys = [], []
    for (b, m), s in samples.items():
        xs += [b * m] * len(s)
        ys += list(s)
    iso = IsotonicRegression(increasing=True, out_of_bounds="clip").fit(np.asarray(xs, float), np.asarray(ys, float))
    totals = sorted({b * m for b, m in samples})
    return {t: float(v) for t, v in zip(totals, iso.predict(np.asarray(totals, float)), strict=True)}


def _affine(runs: np.ndarray) -> tuple[float, float]:
    """(fixed part, per-draft step), both >= 0, of cumulative draft times ``runs`` [repeats, k]."""
    reps, k = runs.shape
    ks = np.tile(np.arange(1, k + 1, dtype=float), reps)
    a = np.column_stack([np.ones_like(ks), ks])
    coef, _ = nnls(a, runs.reshape(-1).astype(float))
    return float(coef[0]), float(coef[1])


def fit_draft(samples: dict[int, np.ndarray]) -> dict[int, dict[int, float]]:
    """``samples[batch]``: cumulative ms after each of k drafts, one row per repeat -> fitted
    ``draft_ms[batch][k]``: affine in k per batch, both parts non-decreasing in the batch."""
    batches = sorted(samples)
    parts = np.array([_affine(np.asarray(samples[b], float)) for b in batches])
    w = np.array([len(samples[b]) for b in batches], float)
    x = np.asarray(batches, float)
    fixed = IsotonicRegression(increasing=True).fit(x, parts[:, 0], sample_weight=w).predict(x)
    step = IsotonicRegression(increasing=True).fit(x, parts[:, 1], sample_weight=w).predict(x)
    k = np.asarray(samples[batches[0]]).shape[1]
    return {b: {j: float(f + s * j) for j in range(1, k + 1)} for b, f, s in zip(batches, fixed, step, strict=True)}


def _resample(samples: dict, rng: np.random.Generator) -> dict:
    out = {}
    for key, s in samples.items():
        a = np.asarray(s, float)
        out[key] = a[rng.integers(0, len(a), len(a))]
    return out


def fit_costs(draft: dict[int, np.ndarray], verify: dict[tuple[int, int], list[float]], *, seed: int = 0,
              bootstrap: int = BOOTSTRAP) -> tuple[dict, dict, dict]:
    """The fitted ``draft_ms`` and ``verify_ms`` of a profile's repeats, and the fit's record:
    raw medians, relative residuals (per cell and the largest), 95 % bootstrap intervals of the
    fitted values, and the repeats."""
    draft_fit, verify_fit = fit_draft(draft), fit_verify(verify)
    raw_draft = {b: {j + 1: float(v) for j, v in enumerate(np.median(np.asarray(r, float), axis=0))}
                 for b, r in draft.items()}
    raw_verify: dict[int, list[float]] = {}
    for (b, m), s in verify.items():
        raw_verify.setdefault(b * m, []).append(float(np.median(s)))
    res_draft = {b: {j: raw_draft[b][j] / draft_fit[b][j] - 1 for j in row} for b, row in draft_fit.items()}
    res_verify = {f"{b}x{m}": float(np.median(s)) / verify_fit[b * m] - 1 for (b, m), s in verify.items()}
    rng = np.random.default_rng(seed)
    boot_d = {b: {j: [] for j in row} for b, row in draft_fit.items()}
    boot_v = {t: [] for t in verify_fit}
    for _ in range(bootstrap):
        d, v = fit_draft(_resample(draft, rng)), fit_verify(_resample(verify, rng))
        for b, row in d.items():
            for j, x in row.items():
                boot_d[b][j].append(x)
        for t, x in v.items():
            boot_v[t].append(x)
    worst = max([abs(x) for row in res_draft.values() for x in row.values()] + [abs(x) for x in res_verify.values()],
                default=0.0)
    record = {
        "model": "verify: isotonic in the tokens of a forward; draft: affine in k per batch, non-decreasing in batch",
        "repeats": min([len(r) for r in draft.values()] + [len(s) for s in verify.values()], default=0),
        "max_residual": round(float(worst), 4),
        "raw_draft_ms": {b: {j: round(x, 4) for j, x in row.items()} for b, row in raw_draft.items()},
        "raw_verify_ms": {t: round(float(np.mean(v)), 4) for t, v in sorted(raw_verify.items())},
        "residuals": {"draft": {b: {j: round(x, 4) for j, x in row.items()} for b, row in res_draft.items()},
                      "verify": {k: round(x, 4) for k, x in res_verify.items()}},
        "interval95": {"draft": {b: {j: [round(float(np.percentile(x, 2.5)), 4), round(float(np.percentile(x, 97.5)), 4)]
                                     for j, x in row.items()} for b, row in boot_d.items()},
                       "verify": {t: [round(float(np.percentile(x, 2.5)), 4), round(float(np.percentile(x, 97.5)), 4)]
                                  for t, x in boot_v.items()}},
    }
    return draft_fit, verify_fit, record


def fit_warnings(record: dict) -> list[str]:
    """Why a fitted profile is not to be trusted (empty: it is)."""
    out = []
    if record["max_residual"] > MAX_RESIDUAL:
        out.append(f"the cost model misses a measured cell by {record['max_residual']:.0%} (more than "
                   f"{MAX_RESIDUAL:.0%}): the times do not follow the model, as on a busy machine, or a cost "
                   "depends on more than the model's inputs (measurement.fit.residuals says which cells)")
    if record["repeats"] < MIN_REPEATS:
        out.append(f"{record['repeats']} repeats per cell, fewer than {MIN_REPEATS}: too few to fit")
    return out
