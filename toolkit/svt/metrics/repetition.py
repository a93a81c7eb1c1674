"""Text statistics that tell a model's output from the data: how much of it repeats what came before
(copying from the prompt vs looping on itself), and how far it follows a reference continuation."""

from __future__ import annotations

import numpy as np


def repeated_share(prompt: np.ndarray, output: np.ndarray, n: int = 8) -> tuple[int, int, int]:
    """Over the positions t of ``output`` with n tokens ahead: (positions, how many have their next
    n tokens ``output[t:t+n]`` already present in prompt + output[:t], and how many in output[:t]
    alone). Loops show in the second count; copying from the prompt in the first minus the second.

    >>> repeated_share(np.array([7, 8]), np.array([1, 2, 1, 2, 1, 2]), n=2)
    (5, 3, 3)
    """
    out = [int(x) for x in output]
    pro = [int(x) for x in prompt]
    positions = max(0, len(out) - n + 1)
    seen_all = {tuple(pro[i : i + n]) for i in range(max(0, len(pro) - n + 1))}
    seen_out: set = set()
    # n-grams that end at or before t-1 are "before t"; the n-grams straddling prompt|output count for
    # prompt + output
    joined = pro + out
    p = len(pro)
    hit_all = hit_out = 0
    for t in range(positions):
        # add the n-grams of joined that end at position p + t - 1 (fully before output[t])
        end = p + t  # exclusive end
        if end - n >= 0 and end - n >= len(pro) - n + 1:  # straddling or inside the output
            seen_all.add(tuple(joined[end - n : end]))
        if t - n >= 0:
            seen_out.add(tuple(out[t - n : t]))
        w = tuple(out[t : t + n])
        hit_all += w in seen_all
        hit_out += w in seen_out
    return positions, hit_all, hit_out


def common_prefix(a, b) -> int:
    """Length of the common prefix of two token sequences.

    >>> common_prefix(np.array([1, 2, 3]), np.array([1, 2, 4, 5]))
    2
    """
    a, b = np.asarray(a), np.asarray(b)
    n = min(a.size, b.size)
    if n == 0:
        return 0
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n
