"""The losslessness audit on logged distributions: the bias a feature's trimming rule would cause.

For each position logged in ``dists/`` (top-k of q and p plus tail mass), the candidate tokens are
the union of both top-k lists plus one "tail" pseudo-token holding the remaining mass of each
distribution. The feature is evaluated as if each candidate had been the drafted token (its
``q_sampled``/``p_sampled`` replaced, every q-only column kept), "trim when feature < threshold"
gives the trimmed set, and ``svt.metrics.lossless.bias`` the total-variation distance to p.
Approximation: tail tokens count as one token whose q is the smallest top-k probability (tail
tokens are at most that likely). Features that do not read the drafted token are exactly 0.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from svt.features import Feature, feature_values
from svt.metrics.lossless import bias

# the columns a draft shares with every other token the drafter could have drawn at its position
# (a confidence head's reads the slot and the token before it, so it is one of them)
Q_ONLY = ("workload", "q_max", "q_entropy", "q_margin", "p_max", "accept_prob_expected", "label", "confidence")


def candidate_distributions(dists: pl.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Aligned q and p over [q top-k ids, p-only top-k ids, tail], and the candidates' ids (-1 =
    tail or padding)."""
    q_ids = np.stack(dists["q_top_ids"].to_numpy()).astype(np.int64)
    q_pr = np.stack(dists["q_top_probs"].to_numpy()).astype(np.float64)
    p_ids = np.stack(dists["p_top_ids"].to_numpy()).astype(np.int64)
    p_pr = np.stack(dists["p_top_probs"].to_numpy()).astype(np.float64)
    match = p_ids[:, :, None] == q_ids[:, None, :]  # [n, kp, kq]
    p_at_q = np.einsum("npq,np->nq", match, p_pr)
    p_only = p_pr * ~match.any(-1)
    n = len(dists)
    q_vec = np.concatenate([q_pr, np.zeros_like(p_pr), np.zeros((n, 1))], 1)
    p_vec = np.concatenate([p_at_q, p_only, np.zeros((n, 1))], 1)
    q_vec[:, -1] = np.clip(1 - q_vec.sum(1), 0, 1)
    p_vec[:, -1] = np.clip(1 - p_vec.sum(1), 0, 1)
    q_vec /= q_vec.sum(1, keepdims=True)
    p_vec /= p_vec.sum(1, keepdims=True)
    ids = np.concatenate([q_ids, np.where(match.any(-1), -1, p_ids), np.full((n, 1), -1)], 1)
    return q_vec, p_vec, ids


def audit(drafts: pl.DataFrame, dists: pl.DataFrame, feat: Feature, threshold: float) -> dict:
    """Mean and max bias over the logged positions for "trim when feature < threshold"."""
    keys = ["request", "step", "position"]
    cols = [c for c in Q_ONLY if c in drafts.columns]
    joined = dists.join(drafts.select(*keys, *cols, *(c for c in ("run",) if c in drafts.columns)),
                        on=keys + (["run"] if "run" in dists.columns else []), how="inner")
    if joined.height == 0:
        return {"positions": 0, "mean_bias": None, "max_bias": None, "threshold": threshold}
    q_vec, p_vec, _ = candidate_distributions(joined)
    n, width = q_vec.shape
    q_min_top = np.stack(joined["q_top_probs"].to_numpy()).min(1)
    q_cand = q_vec.copy()
    q_cand[:, -1] = q_min_top  # a tail token is at most as likely as the least likely top-k one
    long = joined.select(cols).with_row_index("_row").select(pl.all().repeat_by(width).explode())
    long = long.with_columns(
        pl.Series("q_sampled", q_cand.reshape(-1)).cast(pl.Float32),
        pl.Series("p_sampled", p_vec.reshape(-1)).cast(pl.Float32),
        pl.lit(0, dtype=pl.Int16).alias("position") if "position" not in long.columns else pl.col("position"),
    )
    long = long.with_columns(pl.Series("position", np.repeat(joined["position"].to_numpy(), width)))
    values = feature_values(feat, long).reshape(n, width)
    trimmed = values < threshold
    b = bias(p_vec, q_vec, trimmed)
    return {"positions": int(n), "mean_bias": float(b.mean()), "max_bias": float(b.max()),
            "threshold": float(threshold)}
