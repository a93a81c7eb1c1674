"""Verify time as a surface over the rows of a target forward and the tokens a row.

A measured table's ``verify_rows_ms[rows][tokens a row]`` (what ``svt collect --profile-costs``
fits) is read at any (rows, tokens): tokens a row = tokens / rows, interpolated linearly within a
measured row count (linear extrapolation past the widest forward measured), then linearly across
row counts; below the smallest row count measured the smallest's times are read (never cheaper),
above the largest time grows in proportion to the rows. The grid is made non-decreasing along
both axes first (timing noise in a hand-written table can dip; more rows or tokens never cost
less), so every read is monotone in rows and in tokens.
"""

from __future__ import annotations

import numpy as np


class VerifySurface:
    def __init__(self, grid: dict[int, dict[int, float]]):
        self.rows = np.array(sorted(grid), dtype=np.float64)
        self._lines = []
        for b in sorted(grid):
            ms = np.array(sorted(grid[b]), dtype=np.float64)
            self._lines.append((ms, np.maximum.accumulate(np.array([grid[b][int(m)] for m in ms]))))
        self.widest = min(float(line[0][-1]) for line in self._lines)

    def __call__(self, tokens, rows) -> np.ndarray:
        t = np.asarray(tokens, dtype=np.float64)
        n = np.broadcast_to(np.asarray(rows, dtype=np.float64), t.shape)
        width = t / np.maximum(n, 1.0)
        per_rows = np.maximum.accumulate(np.array([_line(width, *line) for line in self._lines]), axis=0)
        if self.rows.size == 1:
            out = per_rows[0] * np.maximum(n / self.rows[0], 1.0)
            return np.maximum(out, 0.0)
        i = np.clip(np.searchsorted(self.rows, n, side="right") - 1, 0, self.rows.size - 2)
        lo, hi = self.rows[i], self.rows[i + 1]
        frac = np.clip((n - lo) / (hi - lo), 0.0, 1.0)
        a = np.take_along_axis(per_rows, i[None], 0)[0]
        b = np.take_along_axis(per_rows, i[None] + 1, 0)[0]
        out = a + frac * (b - a)
        out = np.where(n > self.rows[-1], per_rows[-1] * n / self.rows[-1], out)
        return np.maximum(out, 0.0)


def _line(x, xs, ys):
    """Linear interpolation, linear extrapolation beyond the last two points, the first value below."""
    out = np.interp(x, xs, ys)
    if xs.size >= 2:
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        out = np.where(x > xs[-1], ys[-1] + slope * (x - xs[-1]), out)
    return out
