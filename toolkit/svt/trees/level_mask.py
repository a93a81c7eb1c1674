"""The attention mask of one draft-tree level appended to a drafter's cache (draft models and
hidden-state heads alike)."""

from __future__ import annotations

import numpy as np


def level_mask(new: list[tuple[int, ...]], slot: dict, n: int, context: int) -> np.ndarray:
    """``allow`` for one tree level appended after ``n`` cache slots: each new path's slot sees the
    first ``context`` slots (the verified prefix), its ancestors' slots (``slot[prefix]``) and itself."""
    allow = np.zeros((len(new), n + len(new)), dtype=bool)
    allow[:, :context] = True
    for i, path in enumerate(new):
        for j in range(1, len(path)):
            allow[i, slot[path[:j]]] = True
        allow[i, n + i] = True
    return allow
