"""A stable least-significant-digit radix sort of 64-bit keys by their high 32 bits, as compiled
loops (numba). For keys ``rank << 32 | row`` made with rows ascending, sorting the high half
stably sorts the whole keys: the rows of a rank stay ascending. Four passes of one byte each (a
pass whose byte is the same in every key is skipped), each a stream read and a scatter into 256
buckets; it needs a second array of the keys' size."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def _histograms(key, hist):
    for i in range(key.size):
        h = key[i] >> np.uint64(32)
        for d in range(4):
            hist[d, (h >> np.uint64(8 * d)) & np.uint64(255)] += 1


@njit(cache=True, nogil=True)
def _scatter(src, dst, shift, offsets):
    for i in range(src.size):
        b = (src[i] >> shift) & np.uint64(255)
        dst[offsets[b]] = src[i]
        offsets[b] += 1


def radix_sort_high(key: np.ndarray) -> np.ndarray:
    """``key`` (uint64) stably sorted by its high 32 bits; the result may be ``key`` itself or a new
    array (``key``'s contents are then undefined)."""
    n = key.size
    hist = np.zeros((4, 256), dtype=np.int64)
    _histograms(key, hist)
    src, dst = key, None
    for d in range(4):
        if hist[d].max() == n:  # every key has this byte: the pass would not move anything
            continue
        if dst is None:
            dst = np.empty_like(key)
        offsets = np.zeros(256, dtype=np.int64)
        offsets[1:] = np.cumsum(hist[d])[:-1]
        _scatter(src, dst, np.uint64(32 + 8 * d), offsets)
        src, dst = dst, src
    return src


# In place, for keys too many for a second array: an MSD radix sort (American flag sort) of the
# whole 64-bit keys. Keys are distinct (the row rides in the low half), so sorting them whole is the
# same as stably sorting their high halves. Each segment is split on the 8 highest bits on which its
# keys differ (probability ranks share their top bits: no pass over a constant byte), by counting,
# then cycling every key into its bucket; segments of 48 keys or fewer finish by insertion.

_SMALL = 48


@njit(cache=True, nogil=True)
def _insertion(key, lo, hi):
    for i in range(lo + 1, hi):
        v = key[i]
        j = i - 1
        while j >= lo and key[j] > v:
            key[j + 1] = key[j]
            j -= 1
        key[j + 1] = v


@njit(cache=True, nogil=True)
def msd_sort_segments(key, seg_lo, seg_hi, limit, out_lo, out_hi):
    """Sort each segment ``key[seg_lo[i]:seg_hi[i]]`` in place. With ``limit > 0``, a bucket of at
    most ``limit`` keys is left unsorted and written to ``out_lo``/``out_hi`` instead (adjacent ones
    joined up to ``limit`` keys; once the arrays are full, sorted here); return how many were
    written. Sorting each written segment finishes the sort."""
    stack_lo = np.empty(64 * 256, dtype=np.int64)  # depth <= 8 digits, each pushing <= 255 buckets
    stack_hi = np.empty(64 * 256, dtype=np.int64)
    top = 0
    for i in range(seg_lo.size):
        stack_lo[top] = seg_lo[i]
        stack_hi[top] = seg_hi[i]
        top += 1
    count = np.zeros(256, dtype=np.int64)
    head = np.zeros(256, dtype=np.int64)
    tail = np.zeros(256, dtype=np.int64)
    n_out = 0
    while top > 0:
        top -= 1
        lo = stack_lo[top]
        hi = stack_hi[top]
        if hi - lo <= _SMALL:
            _insertion(key, lo, hi)
            continue
        first = key[lo]
        diff = np.uint64(0)
        for i in range(lo + 1, hi):
            diff |= key[i] ^ first
        if diff == 0:
            continue
        hb = 63
        while (diff >> np.uint64(hb)) == np.uint64(0):
            hb -= 1
        shift = np.uint64(max(hb - 7, 0))
        count[:] = 0
        for i in range(lo, hi):
            count[(key[i] >> shift) & np.uint64(255)] += 1
        s = lo
        for b in range(256):
            head[b] = s
            s += count[b]
            tail[b] = s
        for b in range(256):  # cycle each misplaced key to its bucket's next free slot
            while head[b] < tail[b]:
                v = key[head[b]]
                d = (v >> shift) & np.uint64(255)
                while d != b:
                    w = key[head[d]]
                    key[head[d]] = v
                    head[d] += 1
                    v = w
                    d = (v >> shift) & np.uint64(255)
                key[head[b]] = v
                head[b] += 1
        if shift == np.uint64(0):
            continue
        s = lo
        for b in range(256):
            e = s + count[b]
            if e - s > 1:
                if limit > 0 and e - s <= limit and n_out > 0 and out_hi[n_out - 1] == s \
                        and e - out_lo[n_out - 1] <= limit:
                    out_hi[n_out - 1] = e  # adjacent buckets: one segment, sorted whole later
                elif limit > 0 and e - s <= limit and n_out < out_lo.size:
                    out_lo[n_out] = s
                    out_hi[n_out] = e
                    n_out += 1
                else:
                    stack_lo[top] = s
                    stack_hi[top] = e
                    top += 1
            s = e
    return n_out


def sort_in_place(key: np.ndarray, threads: int = 2) -> np.ndarray:
    """``key`` (distinct uint64) sorted in place, with no second array: the top digits split on
    this thread until every segment holds at most 1/16 of the keys, then the segments are sorted on
    ``threads`` threads (the loops release the GIL), the largest first, each to the least loaded."""
    n = key.size
    limit = max(n // 16, 1 << 16)
    out_lo, out_hi = np.empty(4096, dtype=np.int64), np.empty(4096, dtype=np.int64)
    m = msd_sort_segments(key, np.zeros(1, np.int64), np.full(1, n, np.int64), limit, out_lo, out_hi)
    if m == 0:
        return key
    order = np.argsort(out_lo[:m] - out_hi[:m], kind="stable")  # largest first
    shares: list[list[int]] = [[] for _ in range(max(1, threads))]
    loads = [0] * len(shares)
    for i in order:
        t = loads.index(min(loads))
        shares[t].append(int(i))
        loads[t] += int(out_hi[i] - out_lo[i])
    none = np.zeros(0, np.int64)

    def work(idx: list[int]) -> None:
        msd_sort_segments(key, out_lo[idx], out_hi[idx], 0, none, none)

    with ThreadPoolExecutor(max_workers=len(shares), thread_name_prefix="svt-sort") as pool:
        list(pool.map(work, [s for s in shares if s]))
    return key
