"""Summaries of one score against hard labels that merge by addition, and the exact AUC they give.

A worker reads its shards once and returns, per draft position: the count and positives, the sums
of log-loss, Brier and prediction (probability scores), ten equal-width calibration bins (weight,
sum of predictions, sum of labels), and a sparse histogram of the labels over the score's monotone
float64 key cut to its top ``HIGH_BITS`` bits (sign, exponent and 12 bits of mantissa: 4,096 bins
an octave; only the occupied bins travel). Summaries of disjoint shards add up to the summary of their
union, so the merge order does not matter (float sums agree to rounding: 1e-12 relative in tests).

The AUC from a histogram counts the pairs in different bins exactly and the pairs inside a bin as
half (ties): exact when no bin holds two distinct scores with both labels; otherwise off by at most
half the within-bin pair mass, ``sum_b P_b N_b / (2 P N)``, which the histogram itself gives
(:func:`auc_bound`). The second pass refines the bins whose pair mass is above the tolerance: each
worker returns, for those bins only, its counts per distinct float32 key; the merged counts give
each bin's exact within-bin pair count, so with tolerance 0 the AUC is exact in two passes (for
float64 scores, hence for float32 ones), with no global sort.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

HIGH_BITS = 24
SHIFT = np.uint64(64 - HIGH_BITS)
ECE_BINS = 10
LOG_EPS = np.finfo(np.float64).eps  # as svt.metrics.calibration (scikit-learn's clipping)


def float_keys(s: np.ndarray) -> np.ndarray:
    """uint64 keys in the order of the float64 values (-0.0 and +0.0 share one key)."""
    x = np.asarray(s, dtype=np.float64) + 0.0  # -0.0 + 0.0 is +0.0
    bits = x.view(np.uint64)
    return np.where(bits >> np.uint64(63), ~bits, bits | np.uint64(1 << 63)).astype(np.uint64)


def key_values(keys: np.ndarray) -> np.ndarray:
    """The float64 values of full keys (:func:`float_keys` inverted)."""
    keys = np.asarray(keys, dtype=np.uint64)
    top = np.uint64(1 << 63)
    return np.where(keys & top, keys & ~top, ~keys).astype(np.uint64).view(np.float64)


def _sparse(keys: np.ndarray, y: np.ndarray, s: np.ndarray | None = None) -> tuple:
    """Distinct ``keys`` (sorted) and their (rejected, accepted) counts; with ``s`` (the scores of a
    probability) also each key's sum of scores."""
    u, inv = np.unique(keys, return_inverse=True)
    counts = np.zeros((u.size, 2), dtype=np.int64)
    np.add.at(counts, (inv, y), 1)
    return (u, counts) if s is None else (u, counts, np.bincount(inv, weights=s, minlength=u.size))


def merge_sparse(parts) -> tuple:
    """Sparse histograms added up (keys sorted, counts and any score sums summed)."""
    parts = [p for p in parts if p[0].size]
    if not parts:
        return np.zeros(0, dtype=np.uint64), np.zeros((0, 2), dtype=np.int64)
    if len(parts) == 1:
        return parts[0]
    u, inv = np.unique(np.concatenate([p[0] for p in parts]), return_inverse=True)
    counts = np.zeros((u.size, 2), dtype=np.int64)
    np.add.at(counts, inv, np.concatenate([p[1] for p in parts]))
    if any(len(p) < 3 for p in parts):
        return u, counts
    return u, counts, np.bincount(inv, weights=np.concatenate([p[2] for p in parts]), minlength=u.size)


@dataclass
class ScoreSummary:
    """One score's mergeable summary over ``k`` draft positions (see the module)."""

    k: int
    probability: bool
    n: np.ndarray = field(default=None)  # [k] labelled drafts
    pos: np.ndarray = field(default=None)  # [k] accepted among them
    hist: list = field(default=None)  # per position: (high keys, counts [m, 2] of rejected / accepted)
    log_loss: np.ndarray = field(default=None)  # [k] sums (probability scores)
    brier: np.ndarray = field(default=None)
    sum_p: np.ndarray = field(default=None)
    ece: np.ndarray = field(default=None)  # [k, n_bins, 3]: weight, sum of p, sum of y
    n_bins: int = ECE_BINS  # calibration bins (equal width here, equal mass from the histogram)

    def __post_init__(self):
        k = self.k
        for name, shape, dt in (("n", (k,), np.int64), ("pos", (k,), np.int64), ("log_loss", (k,), np.float64),
                                ("brier", (k,), np.float64), ("sum_p", (k,), np.float64),
                                ("ece", (k, self.n_bins, 3), np.float64)):
            if getattr(self, name) is None:
                setattr(self, name, np.zeros(shape, dtype=dt))
        if self.hist is None:
            self.hist = [merge_sparse([]) for _ in range(k)]

    def __add__(self, other: ScoreSummary) -> ScoreSummary:
        if (self.k, self.probability, self.n_bins) != (other.k, other.probability, other.n_bins):
            raise ValueError("summaries of different scores, draft lengths or bins do not merge")
        return ScoreSummary(self.k, self.probability, self.n + other.n, self.pos + other.pos,
                            [merge_sparse([a, b]) for a, b in zip(self.hist, other.hist, strict=True)],
                            self.log_loss + other.log_loss, self.brier + other.brier, self.sum_p + other.sum_p,
                            self.ece + other.ece, self.n_bins)


def _position_hists(high: np.ndarray, y: np.ndarray, pos: np.ndarray, k: int, s: np.ndarray | None) -> list:
    """Per position, the sparse histogram (:func:`_sparse`) of the rows' high keys: one dense count
    over the keys' span when it is small beside the rows (a probability's keys span a few octaves),
    else one sort of all rows; never one sort per position."""
    if high.size == 0:
        return [merge_sparse([]) if s is None else (*merge_sparse([]), np.zeros(0)) for _ in range(k)]
    lo = high.min()
    span = int(high.max() - lo) + 1
    if span * k <= 4 * high.size + 4096:
        keys, idx = None, (high - lo).astype(np.int64) * k + pos
        size = span * k
    else:
        keys, inv = np.unique(high, return_inverse=True)
        idx, size = inv.astype(np.int64) * k + pos, keys.size * k
    n = np.bincount(idx, minlength=size).reshape(-1, k)
    a = np.bincount(idx, weights=y, minlength=size).reshape(-1, k).astype(np.int64)
    sums = np.bincount(idx, weights=s, minlength=size).reshape(-1, k) if s is not None else None
    out = []
    for j in range(k):
        at = np.flatnonzero(n[:, j])
        kj = (lo + at.astype(np.uint64)) if keys is None else keys[at]
        counts = np.column_stack([n[at, j] - a[at, j], a[at, j]])
        out.append((kj.astype(np.uint64), counts) if sums is None else (kj.astype(np.uint64), counts, sums[at, j]))
    return out


def summarize(score: np.ndarray, label: np.ndarray, position: np.ndarray, k: int, probability: bool,
              n_bins: int = ECE_BINS) -> ScoreSummary:
    """The summary of one shard's labelled drafts (``label`` 0/1; ``score`` float32, oriented so that
    higher means accepted)."""
    y = np.asarray(label, dtype=np.int64)
    pos = np.asarray(position, dtype=np.int64)
    s = np.asarray(score, dtype=np.float64)
    out = ScoreSummary(k, probability, n_bins=n_bins)
    out.n += np.bincount(pos, minlength=k)[:k]
    out.pos += np.bincount(pos, weights=y, minlength=k)[:k].astype(np.int64)
    out.hist = _position_hists(float_keys(s) >> SHIFT, y, pos, k, s if probability else None)
    if probability:
        p = s
        pc = np.clip(p, LOG_EPS, 1 - LOG_EPS)
        ll = -np.log(np.where(y == 1, pc, 1 - pc))  # the single machine's hard-label log-loss
        sq = (p - y) ** 2
        for j in range(k):  # numpy's pairwise sums (error ~ log n ulp), not a running total per position
            m = pos == j
            out.log_loss[j] += np.sum(ll[m])
            out.brier[j] += np.sum(sq[m])
            out.sum_p[j] += np.sum(p[m])
        b = np.minimum((p * n_bins).astype(np.int64), n_bins - 1)
        idx = pos * n_bins + b
        for j, w in enumerate((None, p, y)):
            out.ece[:, :, j] += np.bincount(idx, weights=w, minlength=k * n_bins).reshape(k, n_bins)
    return out


def auc_parts(hist) -> tuple[float, float, float, np.ndarray]:
    """From a sparse histogram (keys ascending, counts ``[m, 2]``): (pairs ordered right, counting
    within-bin pairs as half; positives; negatives; each bin's within-bin pair count P_b N_b)."""
    counts = hist[1]
    neg, pos = counts[:, 0].astype(np.float64), counts[:, 1].astype(np.float64)
    below = np.cumsum(neg) - neg
    within = pos * neg
    return float(np.sum(pos * below) + 0.5 * np.sum(within)), float(pos.sum()), float(neg.sum()), within


def auc_bound(hist) -> tuple[float | None, float]:
    """(AUC with ties inside bins counted half, the largest error that can hide: half the
    within-bin pair mass over all pairs); None when one class is absent."""
    right, P, N, within = auc_parts(hist)
    if P == 0 or N == 0:
        return None, 0.0
    return right / (P * N), float(0.5 * within.sum() / (P * N))


def bins_to_refine(hist, tol: float = 0.0) -> np.ndarray:
    """High keys of the bins whose within-bin pair mass (over all pairs) is above ``tol``."""
    _, P, N, within = auc_parts(hist)
    if P == 0 or N == 0:
        return np.zeros(0, dtype=np.uint64)
    return hist[0][0.5 * within / (P * N) > tol]


ALL, EXCLUDING_FIRST = -1, -2  # the pooled groups beside each position


def in_group(position: np.ndarray, g: int) -> np.ndarray:
    """Rows of group ``g``: a draft position (g >= 0), every position (ALL), or all but the first."""
    if g == ALL:
        return np.ones(position.shape, dtype=bool)
    if g == EXCLUDING_FIRST:
        return position >= 1
    return position == g


def group_hist(hist: list, g: int):
    """The sparse histogram of group ``g`` from the per-position ones."""
    if g == ALL:
        return merge_sparse(hist)
    if g == EXCLUDING_FIRST:
        return merge_sparse(hist[1:])
    return hist[g]


def refine_counts(score: np.ndarray, label: np.ndarray, position: np.ndarray, selected: dict[int, np.ndarray]) -> dict:
    """The second pass on one shard: for each group g (:func:`in_group`) and its ``selected[g]``
    high bins, counts of (rejected, accepted) per distinct full key in those bins:
    ``{g: (keys, counts [n, 2])}``, merged across shards by :func:`merge_refined`."""
    keys = float_keys(score)
    high = keys >> SHIFT
    y = np.asarray(label, dtype=np.int64)
    position = np.asarray(position, dtype=np.int64)
    out = {}
    for g, bins in selected.items():
        rows = np.isin(high, bins) & in_group(position, g)
        out[g] = _sparse(keys[rows], y[rows])
    return out


def merge_refined(parts: list[dict]) -> dict:
    groups = {g for part in parts for g in part}
    return {g: merge_sparse([part[g] for part in parts if g in part]) for g in groups}


def exact_auc(hist, refined) -> tuple[float | None, float]:
    """The AUC with the refined bins' within-bin pairs counted exactly (ties in one key as half),
    and the bound of what is left unrefined."""
    right, P, N, within = auc_parts(hist)
    if P == 0 or N == 0:
        return None, 0.0
    done = np.zeros(within.size, dtype=bool)
    if refined is not None and refined[0].size:
        keys, counts = refined  # sorted by key, so each bin's keys are one run
        high = keys >> SHIFT
        starts = np.flatnonzero(np.r_[True, high[1:] != high[:-1]])
        ends = np.r_[starts[1:], high.size]
        where = np.searchsorted(hist[0], high[starts])
        for a, e, b in zip(starts, ends, where, strict=True):
            c = counts[a:e].astype(np.float64)
            neg_below = np.cumsum(c[:, 0]) - c[:, 0]
            right += float(np.sum(c[:, 1] * neg_below) + 0.5 * np.sum(c[:, 1] * c[:, 0])) - 0.5 * within[b]
            done[b] = True
    return right / (P * N), float(0.5 * within[~done].sum() / (P * N))


def roc_points(hist, n_points: int = 200) -> dict:
    """ROC points at up to ``n_points`` thresholds spread over the histogram's bins (descending),
    from (0, 0): each one exact, the rates of every score at or above a bin's lowest key."""
    counts = hist[1][::-1].astype(np.float64)  # highest bins first
    if counts.size == 0:
        return {"fpr": [0.0], "tpr": [0.0]}
    tp, fp = np.cumsum(counts[:, 1]), np.cumsum(counts[:, 0])
    keep = np.unique(np.linspace(0, counts.shape[0] - 1, min(n_points, counts.shape[0])).astype(np.int64))
    return {"fpr": np.r_[0.0, fp[keep] / max(fp[-1], 1e-12)].tolist(),
            "tpr": np.r_[0.0, tp[keep] / max(tp[-1], 1e-12)].tolist()}


def reliability_bins(ece: np.ndarray) -> dict:
    """The equal-width reliability bins (``[bins, 3]``: weight, sum of p, sum of y) as the single
    machine's report gives them: the filled bins' mean prediction, rate and count."""
    filled = ece[:, 0] > 0
    return {"mean_pred": (ece[filled, 1] / ece[filled, 0]).tolist(), "rate": (ece[filled, 2] / ece[filled, 0]).tolist(),
            "count": ece[filled, 0].astype(np.int64).tolist()}


def _mass_bin(before: np.ndarray, total: float, n_bins: int) -> np.ndarray:
    """Equal-mass bin of a tie group with ``before`` rows below it, in the single machine's float
    arithmetic (:func:`svt.metrics.calibration.mass_bin_index`)."""
    return np.minimum((np.asarray(before, dtype=np.float64) / total * n_bins).astype(np.int64), n_bins - 1)


def mass_bins_to_refine(hist, n_bins: int = ECE_BINS) -> np.ndarray:
    """High keys of the bins that straddle an equal-mass boundary (their scores fall in two
    equal-mass bins): at most ``n_bins - 1``; the second pass gives their distinct keys."""
    counts = hist[1].sum(axis=1)
    total = float(counts.sum())
    if total == 0:
        return np.zeros(0, dtype=np.uint64)
    lo = np.cumsum(counts) - counts
    return hist[0][_mass_bin(lo, total, n_bins) != _mass_bin(lo + counts - 1, total, n_bins)]


def ece_mass(hist, refined, n_bins: int = ECE_BINS) -> float | None:
    """Equal-mass ECE (the single machine's: tied scores share a bin, a group's bin set by the rows
    below it) from a histogram with score sums, exact given the distinct keys (``refined``) of
    every bin :func:`mass_bins_to_refine` names; None without score sums."""
    if len(hist) < 3 or not hist[0].size:
        return None
    keys, counts, sums = hist
    rk, rc = refined if refined is not None else (np.zeros(0, np.uint64), np.zeros((0, 2), np.int64))
    rn = rc.sum(axis=1).astype(np.float64)
    return _mass_ece(keys, counts.sum(axis=1).astype(np.float64), counts[:, 1].astype(np.float64), sums,
                     (rk, rn, rc[:, 1].astype(np.float64), rn * key_values(rk)), n_bins)


def _mass_ece(keys, n, sy, ss, refined: tuple, n_bins: int) -> float:
    """Equal-mass ECE from per-bin rows ``n``, label sums ``sy`` and score sums ``ss``; the bins
    straddling a boundary are split by ``refined`` (full keys, rows, label sums, score sums)."""
    total = float(n.sum())
    lo = np.cumsum(n) - n
    split = _mass_bin(lo, total, n_bins) != _mass_bin(lo + n - 1, total, n_bins)
    b = _mass_bin(lo, total, n_bins)
    mass_s = np.bincount(b[~split], weights=ss[~split], minlength=n_bins).astype(np.float64)
    mass_y = np.bincount(b[~split], weights=sy[~split], minlength=n_bins).astype(np.float64)
    if split.any():
        rk, rn, ry, rs = refined
        inside = np.isin(rk >> SHIFT, keys[split])
        rk, rn, ry, rs = rk[inside], rn[inside], ry[inside], rs[inside]
        if rn.sum() != n[split].sum():
            raise ValueError("the second pass misses keys of a bin straddling an equal-mass boundary")
        at = np.searchsorted(keys, rk >> SHIFT)  # each distinct key's bin: rows below = the bin's + the keys before
        within = np.cumsum(rn) - rn
        first = np.searchsorted(rk >> SHIFT, keys[at], side="left")
        rb = _mass_bin(lo[at] + within - within[first], total, n_bins)
        mass_s += np.bincount(rb, weights=rs, minlength=n_bins)
        mass_y += np.bincount(rb, weights=ry, minlength=n_bins)
    return float(np.abs(mass_s - mass_y).sum() / total)


def _soft_hist(keys: np.ndarray, y: np.ndarray, s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct ``keys`` and, per key, [rows, sum of the soft label, sum of the score]: one dense
    count over the keys' span when it is small beside the rows, else one sort."""
    if keys.size and int(keys.max() - keys.min()) < 4 * keys.size + 4096:
        lo = keys.min()
        inv = (keys - lo).astype(np.int64)
        n = np.bincount(inv)
        at = np.flatnonzero(n)
        u, size = lo + at.astype(np.uint64), n.size
    else:
        u, inv = np.unique(keys, return_inverse=True)
        at, size = slice(None), u.size
    w = np.column_stack([np.bincount(inv, minlength=size)[at].astype(np.float64),
                         np.bincount(inv, weights=y, minlength=size)[at], np.bincount(inv, weights=s, minlength=size)[at]])
    return u.astype(np.uint64), w


def _merge_soft_hist(parts) -> tuple[np.ndarray, np.ndarray]:
    parts = [p for p in parts if p[0].size]
    if not parts:
        return np.zeros(0, dtype=np.uint64), np.zeros((0, 3))
    if len(parts) == 1:
        return parts[0]
    u, inv = np.unique(np.concatenate([p[0] for p in parts]), return_inverse=True)
    w = np.concatenate([p[1] for p in parts])
    return u, np.column_stack([np.bincount(inv, weights=w[:, c], minlength=u.size) for c in range(3)])


@dataclass
class SoftSummary:
    """One score against one soft label (an acceptance probability in [0, 1]), over every draft
    position: the single machine's ``soft`` block, merged by addition. Pairs are weighted (a row is
    y accepted and 1 - y rejected) and a row's pairs with itself are left out, as on one machine.
    Its AUC comes from the histogram alone: the pairs inside a bin count as half, and the error
    that can hide is bounded (:func:`soft_block`); the equal-mass bins are exact given the keys of
    the few bins straddling a boundary (:func:`refine_soft`)."""

    probability: bool
    n_bins: int = ECE_BINS
    sums: np.ndarray = field(default=None)  # rows, sum y, sum y(1 - y), log-loss, Brier, sum of the score
    ece: np.ndarray = field(default=None)  # [n_bins, 3]: weight, sum of the score, sum of y
    hist: tuple = field(default=None)  # (high keys, [m, 3]: rows, sum of y, sum of the score)

    def __post_init__(self):
        if self.sums is None:
            self.sums = np.zeros(6)
        if self.ece is None:
            self.ece = np.zeros((self.n_bins, 3))
        if self.hist is None:
            self.hist = _merge_soft_hist([])

    def __add__(self, other: SoftSummary) -> SoftSummary:
        if (self.probability, self.n_bins) != (other.probability, other.n_bins):
            raise ValueError("soft summaries of different scores or bins do not merge")
        return SoftSummary(self.probability, self.n_bins, self.sums + other.sums, self.ece + other.ece,
                           _merge_soft_hist([self.hist, other.hist]))


def summarize_soft(score: np.ndarray, y: np.ndarray, probability: bool, n_bins: int = ECE_BINS) -> SoftSummary:
    """The soft summary of one shard's labelled drafts (``y`` the soft label of each)."""
    s = np.asarray(score, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    out = SoftSummary(probability, n_bins)
    out.hist = _soft_hist(float_keys(s) >> SHIFT, y, s)
    out.sums[:3] = [s.size, np.sum(y), np.sum(y * (1 - y))]
    if probability:
        pc = np.clip(s, LOG_EPS, 1 - LOG_EPS)
        out.sums[3:] = [-np.sum(y * np.log(pc) + (1 - y) * np.log1p(-pc)), np.sum((s - y) ** 2), np.sum(s)]
        b = np.minimum((s * n_bins).astype(np.int64), n_bins - 1)
        for j, w in enumerate((None, s, y)):
            out.ece[:, j] += np.bincount(b, weights=w, minlength=n_bins)
    return out


def soft_mass_bins(hist, n_bins: int = ECE_BINS) -> np.ndarray:
    """High keys of the soft histogram's bins straddling an equal-mass boundary (by rows)."""
    return mass_bins_to_refine((hist[0], np.column_stack([hist[1][:, 0], np.zeros(hist[0].size)]).astype(np.int64)),
                               n_bins)


def refine_soft(score: np.ndarray, y: np.ndarray, bins: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The second pass for a soft summary on one shard: per distinct full key in ``bins``, [rows, sum
    of y, sum of the score]; merged across shards by :func:`merge_soft_refined`."""
    s = np.asarray(score, dtype=np.float64)
    keys = float_keys(s)
    rows = np.isin(keys >> SHIFT, bins)
    return _soft_hist(keys[rows], np.asarray(y, dtype=np.float64)[rows], s[rows])


def merge_soft_refined(parts) -> tuple[np.ndarray, np.ndarray]:
    return _merge_soft_hist(parts)


def soft_block(t: SoftSummary, refined=None, direction: int = 1) -> dict:
    """The single machine's soft block (n, accept_rate, AUC, and for a probability log-loss, Brier,
    mean prediction and both ECEs; no ``reasons``, as there) with ``auc_bound``: the AUC counts a
    bin's pairs of distinct rows as half, so it may be off by half their weight
    (:class:`SoftSummary`), rounded outward by a few units in the last place (the bound can be met
    exactly, and the AUC carries its own rounding); ``auc_raw`` (1 - AUC) when lower values
    accept."""
    from svt.metrics.specs import names

    n, sy, self_pairs = t.sums[:3]
    out: dict = {"n": int(n)}
    if n <= 0:
        return {**out, **dict.fromkeys(("auc", "accept_rate", *names("table", probability=True))), "auc_bound": 0.0}
    keys, w = t.hist
    P, N = w[:, 1], w[:, 0] - w[:, 1]
    below = np.cumsum(N) - N
    num = float(np.sum(P * (below + 0.5 * N)))
    pos, neg = float(P.sum()), float(N.sum())
    den = pos * neg - self_pairs
    out["accept_rate"] = float(sy / n)
    if pos <= 0 or neg <= 0 or den <= 0:
        out.update({"auc": None, "auc_bound": 0.0})
    else:
        # inside a bin, the pairs of distinct rows weigh P_b N_b less each row's pair with itself
        # (summed over the bins: the whole self-pair weight); each counts half, the truth is 0 or 1
        bound = 0.5 * max(float(np.sum(P * N)) - self_pairs, 0.0) / den
        out.update({"auc": float((num - 0.5 * self_pairs) / den), "auc_bound": float(bound * (1 + 1e-12) + 1e-15)})
        if direction < 0:
            out["auc_raw"] = 1.0 - out["auc"]
    if t.probability:
        e = t.ece
        out.update({"log_loss": float(t.sums[3] / n), "brier": float(t.sums[4] / n), "mean_pred": float(t.sums[5] / n),
                    "ece": float(np.abs(e[:, 1] - e[:, 2]).sum() / n), "ece_mass": _soft_ece_mass(t, refined)})
    else:
        out.update(dict.fromkeys(names("table", probability=True)))
    return out


def _soft_ece_mass(t: SoftSummary, refined) -> float:
    """Equal-mass ECE of a soft label (bins by rows, as on one machine)."""
    keys, w = t.hist
    rk, rw = refined if refined is not None else (np.zeros(0, np.uint64), np.zeros((0, 3)))
    return _mass_ece(keys, w[:, 0], w[:, 1], w[:, 2], (rk, rw[:, 0], rw[:, 1], rw[:, 2]), t.n_bins)
