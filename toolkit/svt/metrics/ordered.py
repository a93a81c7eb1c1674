"""Exact metric tables for one score from a single value sort, in bounded extra memory.

The table of `svt evaluate` for one score (AUC, log-loss, Brier, mean prediction, ECE with equal
width and equal mass bins; overall, excluding the first position and per position; the soft-label
blocks; the ROC points and reliability bins) is computed in two passes over fixed-size chunks:

- the **unordered pass** needs no order: per-position sums of the label, the score, the log-loss
  and squared-error terms, and the equal-width bins, combined into every scope afterwards;
- the **ordered pass** walks the rows in ascending score order, in chunks cut between tie groups,
  and counts the positives and negatives of every tie group at every position with one integer
  ``bincount``; each scope (every position, all rows, rows past the first) then accumulates its AUC
  with ties counted one half (negatives below each group, carried across chunks) and its
  equal-mass bins (the rows before each group).

The order comes from one sort of 64-bit keys ``rank << 32 | row``: ``rank`` is the score's float32
bit pattern made monotone. When the scores are not float32 values, rounding may merge distinct
scores; the merged groups are re-sorted by the float64 score and the keys rebuilt from dense
ranks, so ties are always exact ties of the float64 score. The keys are sorted by a stable radix
sort of their ranks (rows are made ascending, so ties come out in row order), or beyond `LARGE`
rows by an in-place radix sort of the whole keys (no second array; distinct keys, so the same
order); either is several times faster than ``argsort``, and the row rides in the key, so no
permutation array is held. A score with the same ranks as an earlier one (a strictly increasing
transform) shares its key, and a score that is not a probability shares the earlier score's whole
ordered pass (`score_tables`' ``shared``, one feature at a time beyond `LARGE` too). Each row's
label, position and soft labels are packed in one record, so reading rows in score order costs
one memory access per row. Extra memory
is the keys (8 bytes per row), the records, and one chunk's temporaries.

The unordered pass of a probability runs on a second thread beside the sort and the ordered pass
where a core is free: beyond `LARGE`, and from `BESIDE` rows when the score is scored from the main
thread (the feature table's pool threads already keep both cores busy).

Under the same rule the exact walks over an order run on two threads: the float32 keys, the rank
checks and the dense-rank rewrite one half each (the rewrite cut where a segment opens). Beyond
`LARGE` only (features scored one at a time, so the second core is free), the ordered pass runs up from the lowest rank to a group
boundary near the middle and down from the highest (`_scan_in_halves`; its AUC sums are turned
around exactly, the soft-label ones to rounding).

With 0/1 labels every AUC sum is an integer or half-integer, exact in float64 up to about 10^8
labelled drafts of each class.
"""

from __future__ import annotations

import functools
import sys
import threading
import weakref
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from svt.cores import available_cores
from svt.metrics.calibration import LOG_EPS
from svt.metrics.specs import names

CHUNK = 1 << 22  # rows per chunk of either pass
LARGE = 1 << 25  # rows beyond which sorts work in place (memory before speed)
BESIDE = 1 << 20  # rows from which a score scored on the main thread runs its unordered pass beside the sort
DENSE_LIMIT = 4  # a chunk's [group, position] count table when its cells are under 4x its rows
COMPILED = True  # the ordered pass as one compiled walk (False: the numpy pass, the reference)
NOT_PROBABILITY = "not a probability: log-loss, ECE and Brier need a fitted predictor (svt fit)"
_PROB_KEYS = names("table", probability=True)


def _float32_keys(s: np.ndarray, out: np.ndarray) -> bool:
    """Write ``rank << 32 | row`` into ``out`` (unsorted), where ``rank`` is ``s`` rounded to
    float32 with its bit pattern made monotone; return whether the rounding was exact (then the
    ranks are equal exactly where ``s`` is). One compiled pass when ``COMPILED``
    (`svt.metrics.ranks_kernel.float32_keys`); else numpy, chunk by chunk (the reference)."""
    if COMPILED:
        from svt.metrics.ranks_kernel import float32_keys

        return all(_in_halves(lambda a, b: bool(float32_keys(s[a:b], out[a:b], a)), s.size))
    exact = True
    for a in range(0, s.size, CHUNK):
        sc = s[a:a + CHUNK]
        s32 = sc.astype(np.float32)
        s32 += np.float32(0.0)  # -0.0 becomes +0.0: equal scores, one key
        exact = exact and bool(np.array_equal(s32, sc))
        u = s32.view(np.uint32)
        u ^= np.negative(u >> np.uint32(31)) | np.uint32(0x80000000)  # negative: flip all bits; else the sign
        out[a:a + CHUNK] = u.astype(np.uint64) << np.uint64(32)
        out[a:a + CHUNK] |= np.arange(a, a + sc.size, dtype=np.uint64)
    return exact


@functools.cache
def _pair_pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=2, thread_name_prefix="svt-halves")


def _two_cores(n: int) -> bool:
    """Whether a walk over ``n`` rows may take a second thread: beyond :data:`LARGE` (features scored
    one at a time), or from :data:`BESIDE` rows when scored from the main thread (the feature
    table's pool threads already keep both cores busy)."""
    return n > LARGE or (n >= BESIDE and available_cores() > 1
                         and threading.current_thread() is threading.main_thread())


def _in_halves(fn, n: int, cut: int | None = None) -> list:
    """``fn(lo, hi)`` over rows ``0:n``: where :func:`_two_cores` allows (beyond :data:`LARGE` rows, or a
    large score scored from the main thread) on two threads, rows ``0:cut`` and ``cut:n`` (``cut``: ``n // 2`` by default; the compiled walks
    release the GIL); else once, over all rows. The results in that order."""
    cut = n // 2 if cut is None else cut
    if not _two_cores(n) or not 0 < cut < n:
        return [fn(0, n)]
    return list(_pair_pool().map(lambda ab: fn(*ab), ((0, cut), (cut, n))))


def _sort_keys(key: np.ndarray) -> np.ndarray:
    """Sort keys ``rank << 32 | row`` made with rows ascending (:func:`_float32_keys`): a stable
    radix sort of the ranks (`svt.metrics.radix_kernel`; 4.5M keys: about 6x numpy's sort here),
    which needs a second array of the keys. Beyond :data:`LARGE` rows (memory before speed) an
    in-place radix sort of the whole keys on two threads (100M keys: about 2.7x numpy's in-place
    sort here), which needs no second copy; numpy's sort when not ``COMPILED`` (the reference)."""
    if key.size <= LARGE:
        from svt.metrics.radix_kernel import radix_sort_high

        return radix_sort_high(key)
    if COMPILED:
        from svt.metrics.radix_kernel import sort_in_place

        return sort_in_place(key)
    key.sort()
    return key


def same_ranks(key: np.ndarray, s: np.ndarray) -> bool:
    """Whether ``key`` (sorted keys of another score) is exactly the key :func:`order_keys` gives
    ``s``: ``s`` ascends along the order, rising exactly where the ranks rise (a strictly
    increasing transform of the other score: q_max and logit(q_max))."""
    if key.size != s.size:
        return False
    mask, last, last_rank = np.uint64(0xFFFFFFFF), None, None
    probe = key[::max(1, key.size // 4096)]  # a sample that already fails: no full check
    if (np.diff(s[(probe & mask).astype(np.intp)]) < 0).any():
        return False
    if COMPILED:  # halves overlap by one key: every adjacent pair is checked
        from svt.metrics.ranks_kernel import has_ranks

        return all(_in_halves(lambda a, b: bool(has_ranks(key[max(a - 1, 0):b], s)), key.size))
    for a in range(0, key.size, CHUNK):
        kc = key[a:a + CHUNK]
        v = s[(kc & mask).astype(np.intp)]
        r = kc >> np.uint64(32)
        if last is not None:
            v, r = np.r_[last, v], np.r_[last_rank, r]
        dv, up = np.diff(v), r[1:] != r[:-1]
        if not ((dv >= 0).all() and np.array_equal(dv > 0, up)):
            return False
        last, last_rank = v[-1], r[-1]
    return True


def _merged(key: np.ndarray, s: np.ndarray) -> bool:
    """Whether keys sorted by float32 rank put distinct values of ``s`` in one rank (rounding is
    monotone: without such a pair, equal ranks are exactly equal scores and the order sorts ``s``)."""
    mask = np.uint64(0xFFFFFFFF)
    for a in range(0, key.size - 1, CHUNK):
        kc = key[a:a + CHUNK + 1]  # one key past the chunk: pairs across its end
        v = s[(kc & mask).astype(np.intp)]
        r = kc >> np.uint64(32)
        if ((r[1:] == r[:-1]) & (v[1:] != v[:-1])).any():
            return True
    return False


def _score_tie_ends(key: np.ndarray, s: np.ndarray, chunk: int) -> list[int]:
    """Chunk ends of keys already in ascending order of ``s``, each moved past the tie of ``s``
    it would cut."""
    mask = np.uint64(0xFFFFFFFF)
    return _tie_cut_ends(lambda a, b: s[(key[a:b] & mask).astype(np.intp)], key.size, chunk)


def _ranks_from_order(key: np.ndarray, s: np.ndarray, check_only: bool = False, sorted_by_s: bool = False) -> bool:
    """Rewrite sorted-by-float32 keys in place as ``dense rank << 32 | row`` of the float64 ``s``,
    chunk by chunk: float32 rounding is monotone, so only rows that share a float32 value can be out
    of order, and each chunk (cut between float32 values) is re-sorted by ``s`` where it needs to be.
    With ``check_only``, return whether the order already sorts ``s`` and change nothing. With
    ``sorted_by_s`` (an order that sorts ``s``, reused), chunks are cut between ties of ``s``, so
    each tie's rows are put back in row order whole."""
    if COMPILED:  # one compiled walk (`svt.metrics.ranks_kernel`), beyond LARGE one per half
        from svt.metrics.ranks_kernel import dense_ranks, segment_start, sorts

        if check_only:
            return all(_in_halves(lambda a, b: bool(sorts(key[max(a - 1, 0):b], s)), key.size))
        # cut where a segment opens: the second half's ranks start one past the first half's last
        cut = int(segment_start(key, s, sorted_by_s, key.size // 2)) if _two_cores(key.size) else key.size
        last = _in_halves(lambda a, b: int(dense_ranks(key[a:b], s, sorted_by_s)), key.size, cut)
        if len(last) == 2:
            key[cut:] += np.uint64(last[0] + 1) << np.uint64(32)
        return True
    halves = key.view(np.uint32)
    high = halves[1::2] if sys.byteorder == "little" else halves[0::2]
    rank, last = -1, None
    a = 0
    ends = _score_tie_ends(key, s, CHUNK) if sorted_by_s else _chunk_ends(high, key.size, CHUNK)
    for b in ends:
        rows = (key[a:b] & np.uint64(0xFFFFFFFF)).astype(np.intp)
        ss = s[rows]
        down = (ss[1:] < ss[:-1]).any() or (last is not None and ss[0] < last)
        if check_only:
            if down:
                return False
        else:
            if down:  # a stable sort of the float32 groups that descend: equal scores keep their
                # rows ascending; across groups the scores already ascend (rounding is monotone)
                hc = high[a:b]
                groups = np.unique(hc[1:][ss[1:] < ss[:-1]])
                edge = np.zeros(hc.size + 1, dtype=np.int32)
                np.add.at(edge, np.searchsorted(hc, groups, side="left"), 1)
                np.add.at(edge, np.searchsorted(hc, groups, side="right"), -1)
                sub = np.flatnonzero(np.cumsum(edge[:-1]) > 0)
                o = sub[np.argsort(ss[sub], kind="stable")]
                rows, ss = rows.copy(), ss.copy()
                rows[sub], ss[sub] = rows[o], ss[o]
            new = np.empty(ss.size, dtype=np.int64)
            new[0] = rank + (1 if last is None or ss[0] != last else 0)
            np.cumsum(ss[1:] != ss[:-1], out=new[1:])
            new[1:] += new[0]
            bad = np.flatnonzero((new[1:] == new[:-1]) & (rows[1:] < rows[:-1]))
            if bad.size:
                # ties of s that an earlier score's order split: rows ascending within each tie,
                # as a fresh sort gives them (sums over a tie then do not depend on which order
                # was reused); only the rows of those ties are sorted
                ties = np.unique(new[bad])
                edge = np.zeros(new.size + 1, dtype=np.int32)
                np.add.at(edge, np.searchsorted(new, ties, side="left"), 1)
                np.add.at(edge, np.searchsorted(new, ties, side="right"), -1)
                sub = np.flatnonzero(np.cumsum(edge[:-1]) > 0)
                both = (new[sub].astype(np.uint64) << np.uint64(32)) | rows[sub].astype(np.uint64)
                both.sort()
                rows = rows.copy()
                rows[sub] = (both & np.uint64(0xFFFFFFFF)).astype(np.intp)
            key[a:b] = (new.astype(np.uint64) << np.uint64(32)) | rows.astype(np.uint64)
            rank = int(new[-1])
        last = ss[-1]
        a = b
    return True


def order_keys(s: np.ndarray, others: list[np.ndarray] | None = None, *, in_place: bool = False) -> np.ndarray:
    """Sorted keys ``rank << 32 | row`` of the scores ``s`` (ascending; ties in row order; equal
    ranks exactly where ``s`` is equal).

    An order in ``others`` (sorted keys of other scores) with the same ranks as ``s`` is returned
    itself (a strictly increasing transform: q_max and logit(q_max)). Otherwise a fresh float32
    sort is used when its ranks are exact; where float32 rounding merged distinct scores, an order
    of ``others`` that sorts ``s`` is reused rather than re-sorting the merged groups. A new order
    is appended to ``others``. With ``in_place`` (large inputs: one key array at a time), an order
    in ``others`` that sorts ``s`` is rewritten for ``s`` before any new sort, and the orders of
    ``others`` are dropped before a new sort."""
    n = s.size
    if n >= 1 << 32:
        raise ValueError(f"Expected fewer than 2**32 rows per score, but got {n}.")
    for other in others or []:  # the same ranks: the same key (shared, never rewritten)
        if same_ranks(other, s):
            return other
    fresh = None
    if not in_place:  # a float32 sort costs less than rewriting another order, unless it merged
        fresh, merged = _float32_order(s, check=not COMPILED)
        if not merged:
            return _keep(fresh, others)
        if COMPILED:  # the merged groups sorted by s in one compiled walk: cheaper than any reuse
            _ranks_from_order(fresh, s)
            return _keep(fresh, others)
    for i in range(len(others or [])):
        if others[i].size != n:
            continue
        probe = (others[i][::max(1, n // 4096)] & np.uint64(0xFFFFFFFF)).astype(np.intp)
        if (np.diff(s[probe]) < 0).any():  # a sample of that order already fails: no full check
            continue
        if _ranks_from_order(others[i], s, check_only=True):
            # in place: a new array object over the same memory, kept instead of the old one, so
            # nothing cached under the old object (`score_tables`' shared passes) is taken for it
            key = others[i].view() if in_place else others[i].copy()
            if in_place:
                others[i] = key
            _ranks_from_order(key, s, sorted_by_s=True)
            return key
    if fresh is None:
        if in_place and others:
            others.clear()  # the only references: their memory is free before the new keys
        fresh, merged = _float32_order(s)
        if not merged:
            return _keep(fresh, others)
    _ranks_from_order(fresh, s)  # rounding to float32 merged distinct scores: order them by s
    return _keep(fresh, others)


def _float32_order(s: np.ndarray, check: bool = True) -> tuple[np.ndarray, bool]:
    """Keys sorted by the float32 rank of ``s`` and whether rounding merged distinct scores (then
    the merged groups still need ordering by ``s``; without ``check``: whether it may have, i.e.
    the rounding was not exact)."""
    key = np.empty(s.size, dtype=np.uint64)
    exact = _float32_keys(s, key)
    key = _sort_keys(key)
    return key, not exact and (not check or _merged(key, s))


def _keep(key: np.ndarray, others: list[np.ndarray] | None) -> np.ndarray:
    if others is not None:
        others.append(key)
    return key


class _Ordered:
    """Ordered-pass accumulators of several scopes at once: scope ``j`` counts the positives and
    negatives ``P[:, j]``, ``N[:, j]`` of each tie group (AUC with ties one half and distinct-row
    pairs for soft labels; equal-mass bins by the rows before each tie group), carried across
    chunks; the first scope also keeps ROC points at chosen tie groups."""

    def __init__(self, totals: np.ndarray, n_bins: int, probability: bool, self_pairs: np.ndarray,
                 roc_groups: np.ndarray | None = None):
        m = totals.size
        self.totals, self.n_bins, self.probability = totals.astype(np.float64), n_bins, probability
        self.num, self.pos, self.neg, self.before = np.zeros(m), np.zeros(m), np.zeros(m), np.zeros(m)
        self.self_pairs = self_pairs
        self.mass_s = np.zeros((m, n_bins))
        self.mass_y = np.zeros((m, n_bins))
        self.groups = 0
        self.roc_groups = roc_groups
        self.roc_pos: list[np.ndarray] = []
        self.roc_neg: list[np.ndarray] = []

    def add(self, P: np.ndarray, N: np.ndarray, W: np.ndarray, s_group: np.ndarray | None,
            cols: slice = slice(None)) -> None:
        """``P``, ``N``: [groups, scopes] positive and negative weight of each tie group (ascending
        score, every group whole) for the scopes ``cols``; ``W``: rows of each group and scope;
        ``s_group``: each group's score."""
        G = P.shape[0]
        if G == 0:
            return
        cn = np.cumsum(N, axis=0)
        below = self.neg[cols] + cn - N
        if self.roc_groups is not None:
            g = self.roc_groups[(self.roc_groups >= self.groups) & (self.roc_groups < self.groups + G)] - self.groups
            cp = np.cumsum(P[:, 0])
            self.roc_pos.append(self.pos[0] + cp[g] - P[g, 0])
            self.roc_neg.append(below[g, 0])
            self.groups += G
        self.num[cols] += np.einsum("gj,gj->j", P, below + 0.5 * N)
        if self.probability:
            cw = np.cumsum(W, axis=0)
            m, nb = P.shape[1], self.n_bins
            with np.errstate(invalid="ignore", divide="ignore"):
                idx = np.minimum(((self.before[cols] + cw - W) / self.totals[cols] * nb).astype(np.int64), nb - 1)
            cell = (np.arange(m) * nb + np.maximum(idx, 0)).ravel()
            self.mass_s[cols] += np.bincount(cell, weights=(W * s_group[:, None]).ravel(),
                                             minlength=m * nb).reshape(m, nb)
            self.mass_y[cols] += np.bincount(cell, weights=P.ravel(), minlength=m * nb).reshape(m, nb)
            self.before[cols] += cw[-1]
        self.neg[cols] += cn[-1]
        self.pos[cols] += P.sum(axis=0)

    def auc(self, j: int) -> float | None:
        den = self.pos[j] * self.neg[j] - self.self_pairs[j]
        if self.pos[j] <= 0 or self.neg[j] <= 0 or den <= 0:
            return None
        return float((self.num[j] - 0.5 * self.self_pairs[j]) / den)

    def ece_mass(self, j: int) -> float:
        return float(np.abs(self.mass_s[j] - self.mass_y[j]).sum() / self.totals[j])


def auc_reason(n: int, pos: float, neg: float) -> str:
    """Why a block has no AUC (it needs both classes)."""
    if n == 0:
        return "no labelled drafts"
    if pos <= 0:
        return f"only one class (all {n} labelled drafts rejected)"
    return f"only one class (all {n} labelled drafts accepted)"


class _Sums:
    """Unordered-pass sums for one label column, per position (or overall)."""

    def __init__(self, k: int, n_bins: int):
        self.k, self.n_bins = k, n_bins
        z = lambda: np.zeros(k)  # noqa: E731
        self.n, self.y, self.s, self.ll, self.sq = z(), z(), z(), z(), z()
        self.w_cnt = np.zeros((k, n_bins))
        self.w_s = np.zeros((k, n_bins))
        self.w_y = np.zeros((k, n_bins))

    def add(self, s, y, pos, probability: bool, hard: bool, w: np.ndarray | None = None) -> None:
        """A chunk of rows: scores ``s``, labels ``y`` (0/1 when ``hard``), positions ``pos`` (all 0
        when this holds one scope); ``w``: row weights (a bootstrap resample's request counts; a
        row of weight 2 counts as two rows)."""
        k, nb = self.k, self.n_bins
        one = k == 1

        def per_pos(v):  # a sum per position
            return np.array([v.sum()]) if one else np.bincount(pos, weights=v, minlength=k)

        if w is not None:
            self._add_weighted(s, y, pos, probability, hard, w, per_pos)
            return
        if not probability:
            if hard:  # one integer count gives rows and positives per position
                c = np.bincount(pos * 2 + (y == 1.0), minlength=2 * k).reshape(k, 2)
                self.n += c.sum(axis=1)
                self.y += c[:, 1]
            else:
                self.n += np.array([y.size]) if one else np.bincount(pos, minlength=k)
                self.y += per_pos(y)
            return
        cell = np.minimum((s * nb).astype(np.intp), nb - 1)
        if not one:
            cell += pos * nb
        if hard:
            c = np.bincount(cell * 2 + (y == 1.0), minlength=2 * k * nb).reshape(k, nb, 2)
            cnt, ysum = c.sum(axis=2), c[:, :, 1]
        else:
            cnt = np.bincount(cell, minlength=k * nb).reshape(k, nb)
            ysum = np.bincount(cell, weights=y, minlength=k * nb).reshape(k, nb)
        ssum = np.bincount(cell, weights=s, minlength=k * nb).reshape(k, nb)
        self.w_cnt += cnt
        self.w_y += ysum
        self.w_s += ssum
        self.n += cnt.sum(axis=1)
        self.y += ysum.sum(axis=1)
        self.s += ssum.sum(axis=1)
        p = np.clip(s, LOG_EPS, 1 - LOG_EPS)
        if hard:  # one log per row
            ll = -np.log(np.where(y == 1.0, p, 1 - p))
        else:
            ll = -(y * np.log(p) + (1 - y) * np.log1p(-p))
        self.ll += per_pos(ll)
        self.sq += per_pos((s - y) ** 2)

    def _add_weighted(self, s, y, pos, probability: bool, hard: bool, w, per_pos) -> None:
        """:meth:`add` with row weights: every sum weighted, bins by weighted counts."""
        self.n += per_pos(w)
        wy = w * y
        self.y += per_pos(wy)
        if not probability:
            return
        k, nb = self.k, self.n_bins
        cell = np.minimum((s * nb).astype(np.intp), nb - 1)
        if k != 1:
            cell += pos * nb
        self.w_cnt += np.bincount(cell, weights=w, minlength=k * nb).reshape(k, nb)
        self.w_y += np.bincount(cell, weights=wy, minlength=k * nb).reshape(k, nb)
        self.w_s += np.bincount(cell, weights=w * s, minlength=k * nb).reshape(k, nb)
        self.s += per_pos(w * s)
        p = np.clip(s, LOG_EPS, 1 - LOG_EPS)
        ll = -np.log(np.where(y == 1.0, p, 1 - p)) if hard else -(y * np.log(p) + (1 - y) * np.log1p(-p))
        self.ll += per_pos(w * ll)
        self.sq += per_pos(w * (s - y) ** 2)

    def metrics(self, rows, ordered: _Ordered, j: int, probability: bool) -> dict:
        """The metrics of the positions ``rows`` (a slice or list), scope ``j`` of ``ordered``."""
        n = float(self.n[rows].sum())
        out: dict = {"n": int(n)}
        if n <= 0:
            out.update({m: None for m in ("auc", "accept_rate", *_PROB_KEYS)})
            out["reasons"] = {"auc": "no labelled drafts"}
            return out
        out["accept_rate"] = float(self.y[rows].sum() / n)
        reasons = {}
        auc = ordered.auc(j)
        out["auc"] = auc
        if auc is None:
            reasons["auc"] = auc_reason(int(n), ordered.pos[j], ordered.neg[j])
        if probability:
            out["log_loss"] = float(self.ll[rows].sum() / n)
            out["brier"] = float(self.sq[rows].sum() / n)
            out["mean_pred"] = float(self.s[rows].sum() / n)
            gap = self.w_s[rows].sum(axis=0) - self.w_y[rows].sum(axis=0)
            out["ece"] = float(np.abs(gap).sum() / n)
            out["ece_mass"] = ordered.ece_mass(j)
        else:
            for key in _PROB_KEYS:
                out[key] = None
                reasons[key] = NOT_PROBABILITY
        if reasons:
            out["reasons"] = reasons
        return out


def _chunk_ends(high: np.ndarray, n: int, chunk: int) -> list[int]:
    """Chunk ends in the sorted order of ``high``, each moved forward past the tie group it would cut."""
    return _tie_cut_ends(lambda a, b: high[a:b], n, chunk)


def _tie_cut_ends(values, n: int, chunk: int) -> list[int]:
    """Ends of chunks of about ``chunk`` rows over ``n`` rows in ascending order, each moved past
    the tie it would cut; ``values(a, b)`` gives the sort values of rows ``a:b``."""
    ends, a = [], 0
    while a < n:
        b = min(a + chunk, n)
        v = values(b - 1, b)[0]
        while b < n:  # skip the rest of the tie ending the chunk, a window at a time
            window = values(b, b + 65536)
            j = int(np.searchsorted(window, v, side="right"))
            b += j
            if j < window.size:
                break
        ends.append(b)
        a = b
    return ends


def pack_rows(y: np.ndarray, position: np.ndarray, soft: dict[str, np.ndarray] | None = None,
              out: np.ndarray | None = None) -> np.ndarray:
    """Each row's label, position and soft labels in one record: the ordered pass reads rows in
    score order, at random places, and one record costs one memory access instead of several.
    ``out``: records to fill in place (a slice of a larger array)."""
    soft = soft or {}
    pos = np.asarray(position)
    if pos.size and (pos.min() < 0 or pos.max() > np.iinfo(np.uint16).max):
        raise ValueError(f"Expected positions in [0, 65535], but got [{pos.min()}, {pos.max()}].")
    names, formats, offsets, at = ["y", "pos"], [np.uint8, np.uint16], [0, 2], 4
    for name, col in soft.items():
        f = np.result_type(np.asarray(col).dtype, np.float32)
        at = -(-at // f.itemsize) * f.itemsize
        names.append(name)
        formats.append(f)
        offsets.append(at)
        at += f.itemsize
    size = -(-at // 4) * 4  # whole 32-bit words: gathers copy rows of words
    dtype = np.dtype({"names": names, "formats": formats, "offsets": offsets, "itemsize": size})
    if out is not None and out.dtype != dtype:
        raise ValueError(f"Expected `out` of dtype {dtype}, but got {out.dtype}.")
    rec = np.zeros(pos.size, dtype=dtype) if out is None else out
    rec["y"] = y
    rec["pos"] = pos
    for name, col in soft.items():
        rec[name] = col
    return rec


def _take(packed: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``packed[rows]``, as rows of 32-bit words (``np.take`` along the first axis of a 2-D view is
    several times faster than indexing records)."""
    if not packed.flags.c_contiguous:
        return packed[rows]
    words = packed.view(np.uint32).reshape(packed.size, packed.dtype.itemsize // 4)
    return np.take(words, rows, axis=0).view(packed.dtype).reshape(rows.size)


def score_tables(s: np.ndarray, y: np.ndarray, position: np.ndarray, *, probability: bool, n_bins: int = 10,
                 soft: dict[str, np.ndarray] | None = None, key: np.ndarray | None = None,
                 packed: np.ndarray | None = None, shared: dict | None = None, roc_points: int = 200,
                 chunk: int | None = None, weights: np.ndarray | None = None) -> dict:
    """Every metric of one score: ``overall``, ``excluding_first``, ``per_position`` (0/1 labels
    ``y``), ``soft`` (overall, per soft-label column in [0, 1]) and ``curves`` (ROC points and
    reliability bins), as `svt evaluate` reports them.

    ``s``: finite scores (float64; in [0, 1] when ``probability``). ``position``: non-negative
    integers. ``key``: this score's sorted keys from :func:`order_keys` (computed when absent;
    returned under ``"_key"``); ``packed``: :func:`pack_rows` of ``y``, ``position`` and ``soft``
    (made when absent); ``shared``: a dict kept between scores of the same rows (what depends on
    the labels alone is computed once). Memory beyond the inputs and the keys is one chunk's worth.

    ``weights``: a non-negative weight per row (the request-level bootstrap's resample counts); every
    metric is then that of the rows repeated by their weights, through the same accumulators, with
    no soft-label blocks or curves (a position whose rows all have weight 0 is absent; an empty
    ``overall`` or ``excluding_first`` has ``n`` 0).
    """
    n = s.size
    soft = soft or {}
    pos = np.asarray(position)
    k = int(pos.max()) + 1 if n else 1
    if chunk is None:  # a chunk's [groups, positions, 2] count table stays near 2**23 cells
        chunk = max(1 << 16, (1 << 22) // k)
    if packed is None:
        packed = pack_rows(y, pos, soft)
    if weights is not None:  # a resample: the hard-label scopes only
        soft, shared, roc_points = {}, None, 0
    # the unordered pass of a probability needs no order: it runs on a second thread beside the sort
    # and the ordered pass (the compiled loops release the GIL) where a core is free: beyond LARGE
    # (one feature at a time), or a large score scored from the main thread (the feature table's
    # pool threads already keep both cores busy); the ordered pass takes its scope totals from the
    # label sums (the same counts)
    unordered = None
    if probability and _two_cores(n):
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="svt-sums")
        unordered = pool.submit(_score_sums, s, y, pos, soft, k, n_bins, chunk, weights, packed)
        pool.shutdown(wait=False)
    if key is None:
        key = order_keys(s)
    base = _label_sums(y, pos, soft, ("label sums", id(packed), k, n_bins, tuple(soft)), k, n_bins, chunk, shared,
                       weights)
    if probability and unordered is None:
        unordered = _score_sums(s, y, pos, soft, k, n_bins, chunk, weights, packed)
    # a score that is no probability needs only the order's counts (AUCs, ROC points): the same key
    # (a strictly increasing transform of an earlier score) gives the same ordered pass
    # (the entry refers to the key weakly: it never holds a freed order's memory, and an id reused
    # by a later key is no hit)
    pass_key = ("ordered pass", id(key), id(packed), k, n_bins, tuple(soft), roc_points, chunk)
    hit = shared.get(pass_key) if shared is not None and weights is None else None
    if hit is not None and hit[0]() is key and not probability:
        ordered, overall_roc, soft_ord = hit[1]
    else:
        ordered, overall_roc, soft_ord = _ordered_pass(s, key, packed, soft, base["pairs"], base["hard"], k, n_bins,
                                                       chunk, probability, roc_points, weights)
        if shared is not None and weights is None:
            shared[pass_key] = (weakref.ref(key), (ordered, overall_roc, soft_ord))
    if isinstance(unordered, Future):
        unordered = unordered.result()
    hard, soft_sums = unordered if probability else (base["hard"], base["soft"])
    table = {"overall": hard.metrics(slice(None), ordered, k, probability),
             "excluding_first": hard.metrics(slice(1, None), ordered, k + 1, probability),
             "per_position": {int(p): hard.metrics([p], ordered, int(p), probability)
                              for p in np.flatnonzero(hard.n > 0)}}
    table["soft"] = {}
    for name in soft:
        block = soft_sums[name].metrics(slice(None), soft_ord[name], 0, probability)
        block.pop("reasons", None)
        table["soft"][name] = block
    table["curves"] = _curves(overall_roc, hard, probability) if n and weights is None else {}
    table["_key"] = key
    return table


def _label_sums(y, pos, soft: dict, base_key, k: int, n_bins: int, chunk: int, shared: dict | None,
                weights: np.ndarray | None = None) -> dict:
    """The unordered pass's sums that depend on the labels alone (counts, soft-label sums and
    self-pairs): the same for every score of these rows, so ``shared`` keeps them."""
    base = shared.get(base_key) if shared is not None else None
    if base is not None:
        return base
    n = y.size
    base = {"hard": _Sums(k, n_bins), "soft": {name: _Sums(1, n_bins) for name in soft},
            "pairs": dict.fromkeys(soft, 0.0)}
    for a in range(0, n, chunk):
        sl = slice(a, a + chunk)
        base["hard"].add(None, y[sl].astype(np.float64), pos[sl].astype(np.intp), False, hard=True,
                         w=None if weights is None else weights[sl])
        for name, t in soft.items():
            tc = t[sl].astype(np.float64)
            base["soft"][name].add(None, tc, None, False, hard=False)
            base["pairs"][name] += float((tc * (1.0 - tc)).sum())  # a row is never paired with itself
    if shared is not None:
        shared[base_key] = base
    return base


def _score_sums(s, y, pos, soft: dict, k: int, n_bins: int, chunk: int, weights: np.ndarray | None = None,
                packed: np.ndarray | None = None):
    """The unordered pass of a probability score: per-position sums of the label, the score, the
    log-loss and squared-error terms and the equal-width bins (hard labels and each soft label).
    One compiled loop (`svt.metrics.sums_kernel`) when ``COMPILED`` and ``packed`` (the records of
    ``y``, ``pos`` and ``soft``) allows it; else the numpy pass in chunks (the reference)."""
    cols = (_soft_word_columns(packed, soft) if COMPILED and packed is not None and sys.byteorder == "little"
            else None)
    if cols is None:
        return _score_sums_numpy(s, y, pos, soft, k, n_bins, chunk, weights)
    from svt.metrics.sums_kernel import score_sums

    sums, bins = np.zeros((k + len(soft), 5)), np.zeros((k + len(soft), 3, n_bins))
    words = packed.view(np.uint32).reshape(packed.size, packed.dtype.itemsize // 4)
    use_w = weights is not None
    score_sums(s, words, words.view(np.float32), cols, weights if use_w else np.zeros(1), use_w, k, n_bins,
               LOG_EPS, sums, bins)
    hard = _Sums(k, n_bins)
    soft_sums = {name: _Sums(1, n_bins) for name in soft}
    for j, block in enumerate([hard, *soft_sums.values()]):
        rows = slice(0, k) if j == 0 else slice(k + j - 1, k + j)
        block.n, block.y, block.s, block.ll, block.sq = (sums[rows, i].copy() for i in range(5))
        block.w_cnt, block.w_s, block.w_y = (bins[rows, i].copy() for i in range(3))
    return hard, soft_sums


def _score_sums_numpy(s, y, pos, soft: dict, k: int, n_bins: int, chunk: int, weights: np.ndarray | None = None):
    """:func:`_score_sums` in numpy, chunk by chunk."""
    hard = _Sums(k, n_bins)
    soft_sums = {name: _Sums(1, n_bins) for name in soft}
    zeros = np.zeros(1, dtype=np.intp)  # one scope: positions unused
    for a in range(0, s.size, chunk):
        sl = slice(a, a + chunk)
        sc = s[sl].astype(np.float64)  # float32 scores too: bins and logs in float64
        hard.add(sc, y[sl].astype(np.float64), pos[sl].astype(np.intp), True, hard=True,
                 w=None if weights is None else weights[sl])
        for name, t in soft.items():
            soft_sums[name].add(sc, t[sl].astype(np.float64), zeros, True, hard=False)
    return hard, soft_sums


def _roc_groups(n_groups: int, roc_points: int) -> np.ndarray:
    """The tie groups (ascending) at which the overall ROC points are taken: ``roc_points``
    thresholds spread evenly over the groups, from the highest down."""
    keep_desc = np.unique(np.linspace(0, n_groups - 1, min(roc_points, n_groups)).astype(np.int64))
    return np.sort(n_groups - 1 - keep_desc)


def _ordered_pass(s, key, packed, soft: dict, soft_pairs: dict, hard, k: int, n_bins: int, chunk: int,
                  probability: bool, roc_points: int, weights: np.ndarray | None = None):
    """Tie groups in ascending score order: every scope's AUC and equal-mass bins (``ordered``),
    the overall ROC points and each soft label's AUC. One compiled walk over the keys
    (`svt.metrics.ordered_kernel`) when ``COMPILED`` and the records allow it (contiguous, soft
    labels float32, little-endian); else the numpy pass in chunks (the reference)."""
    cols = _soft_word_columns(packed, soft) if COMPILED and sys.byteorder == "little" else None
    if cols is None:
        return _ordered_pass_numpy(s, key, packed, soft, soft_pairs, hard, k, n_bins, chunk, probability,
                                   roc_points, weights)
    from svt.metrics.ordered_kernel import count_groups, ordered_scan

    n = s.size
    halves = key.view(np.uint32)
    low, high = halves[0::2], halves[1::2]
    roc_groups = _roc_groups(count_groups(high), roc_points) if n and roc_points else np.zeros(0, np.int64)
    totals = np.r_[hard.n, hard.n.sum(), hard.n[1:].sum()]
    ordered = _Ordered(totals, n_bins, probability, np.zeros(k + 2))
    overall_roc = _Ordered(totals[k:k + 1], n_bins, False, np.zeros(1), roc_groups)
    soft_ord = {name: _Ordered(totals[k:k + 1], n_bins, probability, np.array([soft_pairs[name]])) for name in soft}
    m = len(soft)
    acc = np.zeros((k + 2 + m, 4))
    mass = np.zeros((k + 2 + m, 2, n_bins))
    roc_pos, roc_neg = np.zeros(roc_groups.size), np.zeros(roc_groups.size)
    words = packed.view(np.uint32).reshape(packed.size, packed.dtype.itemsize // 4)
    use_w = weights is not None
    tot = np.r_[ordered.totals, np.full(m, ordered.totals[k])]
    if n <= LARGE or use_w or not _scan_in_halves(high, low, words, cols, s, probability, k, n_bins, tot, roc_groups,
                                                  acc, mass, roc_pos, roc_neg):
        ordered_scan(high, low, words, words.view(np.float32), cols, s, weights if use_w else np.zeros(1), use_w,
                     probability, k, n_bins, tot, roc_groups, acc, mass, roc_pos, roc_neg, False)
    ordered.num[:], ordered.pos[:], ordered.neg[:], ordered.before[:] = acc[:k + 2].T
    ordered.mass_s[:], ordered.mass_y[:] = mass[:k + 2, 0], mass[:k + 2, 1]
    overall_roc.pos[0], overall_roc.neg[0] = ordered.pos[k], ordered.neg[k]
    overall_roc.roc_pos, overall_roc.roc_neg = [roc_pos], [roc_neg]
    for c, name in enumerate(soft):
        o = soft_ord[name]
        o.num[0], o.pos[0], o.neg[0], o.before[0] = acc[k + 2 + c]
        o.mass_s[0], o.mass_y[0] = mass[k + 2 + c, 0], mass[k + 2 + c, 1]
    return ordered, overall_roc, soft_ord


def _scan_in_halves(high, low, words, cols, s, probability: bool, k: int, n_bins: int, tot, roc_groups,
                    acc, mass, roc_pos, roc_neg) -> bool:
    """The compiled ordered pass on two threads: the groups below a cut near the middle walked up
    from the lowest rank, those above it walked down from the highest (``mirror``), then joined.
    Returns False (nothing written) when no group opens past the middle.

    Walking down, a group's negatives below it are the scope's total negatives less those above and
    in it, so its AUC term ``P (N_below + N/2)`` sums to ``P_above_cut x N_total - sum P (N_above +
    N/2)``: integer counts give the one walk's sums exactly. Its ROC point (the positives and negatives
    below the group) is the total less what the walk down had seen when it closed the group above;
    the first group above the cut takes the walk up's totals."""
    from svt.metrics.ordered_kernel import count_groups, group_start, ordered_scan

    n = high.size
    cut = int(group_start(high, n // 2))
    if not 0 < cut < n:
        return False
    g_cut = int(count_groups(high[:cut]))  # groups below the cut; group g_cut opens at it
    g_all = g_cut + int(count_groups(high[cut:]))
    up_roc = roc_groups[roc_groups < g_cut]
    down_roc = roc_groups[roc_groups > g_cut]
    down_local = (g_all - down_roc)[::-1].copy()  # the walk down closes group g_all - L just before its L-th
    M = acc.shape[0]
    acc_d, mass_d = np.zeros((M, 4)), np.zeros_like(mass)
    rp_u, rn_u = np.zeros(up_roc.size), np.zeros(up_roc.size)
    rp_d, rn_d = np.zeros(down_local.size), np.zeros(down_local.size)
    soft32, none = words.view(np.float32), np.zeros(1)
    halves = [(high[:cut], low[:cut], up_roc, acc, mass, rp_u, rn_u, False),
              (high[cut:][::-1], low[cut:][::-1], down_local, acc_d, mass_d, rp_d, rn_d, True)]
    list(_pair_pool().map(lambda h: ordered_scan(h[0], h[1], words, soft32, cols, s, none, False, probability, k,
                                                  n_bins, tot, h[2], h[3], h[4], h[5], h[6], h[7]), halves))
    P1, N1, P2, N2 = acc[:, 1].copy(), acc[:, 2].copy(), acc_d[:, 1], acc_d[:, 2]
    acc[:, 0] += P2 * (N1 + N2) - acc_d[:, 0]
    acc[:, 1:] += acc_d[:, 1:]
    mass += mass_d
    roc_pos[:up_roc.size], roc_neg[:up_roc.size] = rp_u, rn_u
    at = up_roc.size
    if at < roc_groups.size and roc_groups[at] == g_cut:
        roc_pos[at], roc_neg[at] = P1[k], N1[k]
        at += 1
    roc_pos[at:], roc_neg[at:] = acc[k, 1] - rp_d[::-1], acc[k, 2] - rn_d[::-1]
    return True


def _soft_word_columns(packed: np.ndarray, soft: dict) -> np.ndarray | None:
    """The 32-bit word of each soft label in a record, or None when the compiled pass cannot read
    the records (not contiguous, or a soft label that is not float32)."""
    if not packed.flags.c_contiguous or packed.dtype.itemsize % 4:
        return None
    fields = packed.dtype.fields
    cols = []
    for name in soft:
        f, off = fields[name][:2]
        if f != np.float32 or off % 4:
            return None
        cols.append(off // 4)
    return np.array(cols, dtype=np.int64)


def _ordered_pass_numpy(s, key, packed, soft: dict, soft_pairs: dict, hard, k: int, n_bins: int, chunk: int,
                        probability: bool, roc_points: int, weights: np.ndarray | None = None):
    """:func:`_ordered_pass` in numpy: tie groups in chunks cut between groups, each chunk's records
    gathered and counted per [group, scope]."""
    n = s.size
    halves = key.view(np.uint32)  # [low, high] per key on a little-endian machine: no copy
    low, high = (halves[0::2], halves[1::2]) if sys.byteorder == "little" else (halves[1::2], halves[0::2])
    roc_groups = None
    if n and roc_points:
        n_groups = 1 + sum(int(np.count_nonzero(high[a + 1:min(a + chunk, n - 1) + 1] != high[a:min(a + chunk, n - 1)]))
                           for a in range(0, n - 1, chunk))
        roc_groups = _roc_groups(n_groups, roc_points)
    # scopes: every position, then all rows, then rows past the first position
    totals = np.r_[hard.n, hard.n.sum(), hard.n[1:].sum()]
    ordered = _Ordered(totals, n_bins, probability, np.zeros(k + 2))
    ordered.roc_groups = None
    overall_roc = _Ordered(totals[k:k + 1], n_bins, False, np.zeros(1), roc_groups)
    soft_ord = {name: _Ordered(totals[k:k + 1], n_bins, probability, np.array([soft_pairs[name]])) for name in soft}
    a = 0
    for b in _chunk_ends(high, n, chunk):
        rows = low[a:b].astype(np.intp)
        hc = high[a:b]
        first = np.empty(hc.size, dtype=bool)
        first[0] = True
        np.not_equal(hc[1:], hc[:-1], out=first[1:])
        gidx = np.cumsum(first) - 1
        starts = np.flatnonzero(first)
        rec = _take(packed, rows)
        s_group = s[rows[starts]].astype(np.float64) if probability else None
        wv = None if weights is None else weights[rows]
        P_all, W_all = _ordered_chunk(ordered, rec, gidx, s_group, k, probability, wv)
        overall_roc.add(P_all, W_all - P_all, W_all, None)
        for name in soft:
            Pt = np.add.reduceat(rec[name], starts, dtype=np.float64)[:, None]
            soft_ord[name].add(Pt, W_all - Pt, W_all, s_group)
        a = b
    return ordered, overall_roc, soft_ord


def _ordered_chunk(ordered, rec, gidx, s_group, k: int, probability: bool, wv: np.ndarray | None = None):
    """One chunk's tie groups into every scope; returns the groups' positives and sizes over all rows
    (``wv``: the rows' weights, in this chunk's order)."""
    G = int(gidx[-1]) + 1
    if G * (k + 2) <= DENSE_LIMIT * gidx.size:  # ties are many: one [group, position] count table
        cells = (gidx * k + rec["pos"]) * 2 + rec["y"]
        C = np.bincount(cells, weights=wv, minlength=G * k * 2).reshape(G, k, 2).astype(np.float64)
        N, P = C[:, :, 0], C[:, :, 1]
        Ps = np.concatenate([P, P.sum(axis=1, keepdims=True), P[:, 1:].sum(axis=1, keepdims=True)], axis=1)
        Ns = np.concatenate([N, N.sum(axis=1, keepdims=True), N[:, 1:].sum(axis=1, keepdims=True)], axis=1)
        ordered.add(Ps, Ns, Ps + Ns, s_group)
        return Ps[:, k:k + 1], Ps[:, k:k + 1] + Ns[:, k:k + 1]
    # mostly distinct scores: each scope's rows in score order, its groups by reduceat
    yv = rec["y"].astype(np.float64)
    if wv is not None:
        yv *= wv
    pv = rec["pos"]

    def scope(idx, j):
        g = gidx[idx]
        if g.size == 0:
            return None, None
        st = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
        if wv is None:
            w = np.diff(np.r_[st, g.size]).astype(np.float64)[:, None]
        else:
            w = np.add.reduceat(wv[idx], st)[:, None]
        p = np.add.reduceat(yv[idx], st)[:, None]
        ordered.add(p, w - p, w, s_group[g[st]] if probability else None, cols=slice(j, j + 1))
        return p, w

    P_all, W_all = scope(slice(None), k)
    scope(np.flatnonzero(pv > 0), k + 1)
    by = np.argsort(pv, kind="stable")  # each position's rows, still in score order
    cuts = np.r_[0, np.cumsum(np.bincount(pv, minlength=k))]
    for p in range(k):
        if cuts[p + 1] > cuts[p]:
            scope(by[cuts[p]:cuts[p + 1]], p)
    return P_all, W_all


def _curves(overall_roc, hard, probability: bool) -> dict:
    """The overall ROC points (descending thresholds) and, for a probability, the reliability bins."""
    o = overall_roc
    tp_below = np.concatenate(o.roc_pos) if o.roc_pos else np.zeros(0)
    fp_below = np.concatenate(o.roc_neg) if o.roc_neg else np.zeros(0)
    tp, fp = (o.pos[0] - tp_below)[::-1], (o.neg[0] - fp_below)[::-1]  # descending thresholds
    curves = {"roc": {"fpr": np.r_[0.0, fp / max(o.neg[0], 1e-12)].tolist(),
                      "tpr": np.r_[0.0, tp / max(o.pos[0], 1e-12)].tolist()}}
    if probability:
        cnt, sp, sy = hard.w_cnt.sum(axis=0), hard.w_s.sum(axis=0), hard.w_y.sum(axis=0)
        filled = cnt > 0
        curves["reliability"] = {"mean_pred": (sp[filled] / cnt[filled]).tolist(),
                                 "rate": (sy[filled] / cnt[filled]).tolist(),
                                 "count": cnt[filled].astype(int).tolist()}
    return curves


def bootstrap_intervals(s: np.ndarray, y: np.ndarray, position: np.ndarray, request: np.ndarray, *,
                        probability: bool, n_bins: int = 10, n: int = 0, seed: int = 0, level: float = 0.95,
                        key: np.ndarray | None = None, packed: np.ndarray | None = None) -> dict:
    """Percentile intervals of every compared metric of :func:`score_tables`' scopes (``overall``,
    ``excluding_first`` and each position) from ``n`` request-level resamples: whole requests drawn
    with replacement (their drafts are correlated, rows are not independent), each resample scored
    as multinomial row weights through the same accumulators and the same order (``key``) as the
    point table. Every scope's interval comes from the *same* resamples; a scope no drawn request
    reaches, or whose metric is undefined in a resample, skips that resample."""
    rng = np.random.default_rng(seed)
    _, group = np.unique(np.asarray(request), return_inverse=True)
    n_groups = int(group.max()) + 1 if group.size else 0
    if key is None:
        key = order_keys(np.asarray(s, dtype=np.float64))
    if packed is None:
        packed = pack_rows(y, position)
    draws: dict = {"overall": {}, "excluding_first": {}}
    compared = names("table", compared=True)
    for _ in range(n if n_groups else 0):
        counts = rng.multinomial(n_groups, np.full(n_groups, 1.0 / n_groups)).astype(np.float64)
        t = score_tables(s, y, position, probability=probability, n_bins=n_bins, key=key, packed=packed,
                         weights=counts[group])
        for scope, block in (("overall", t["overall"]), ("excluding_first", t["excluding_first"]),
                             *t["per_position"].items()):
            got = draws.setdefault(scope, {})  # an empty scope's metrics are None: nothing is drawn
            for m in compared:
                if block.get(m) is not None:
                    got.setdefault(m, []).append(block[m])
    lo, hi = (1 - level) / 2 * 100, (1 + level) / 2 * 100
    return {scope: {m: [float(np.percentile(x, lo)), float(np.percentile(x, hi))] for m, x in d.items()}
            for scope, d in draws.items()}
