"""A stable least-significant-digit radix sort of 64-bit keys by their high 32 bits, as compiled
loops (numba). For keys ``rank << 32 | row`` made with rows ascending, sorting the high half
stably sorts the whole keys: the rows of a rank stay ascending. Four passes of one byte each (a
pass whose byte is the same in every key is skipped), each a stream read and a scatter into 256
buckets; it needs a second array of the keys' size."""

from __future__ import annotations

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
