"""Replaying tree policies on a logged greedy tree run: every policy's tree is a subtree of the
logged one, and greedy verification of a subtree is exact offline.

Under greedy verification a node is accepted when its token and every ancestor's is the target's
argmax at its parent (``match`` along the path; logged for every node of a greedy run), so the
accepted length of any ancestor-closed subtree ``S`` is the depth of its deepest node whose path is
matched throughout. A policy only chooses ``S``:

- ``chain``: the rank-0 path down to depth K (the chain of K drafts);
- ``static``: every node whose rank at each level is below that level's width;
- ``path-prob``: the best ``n`` nodes by the drafter's path probability (EAGLE-2's rerank);
- ``predictor``: the best ``n`` nodes by the product of a predictor's acceptance probabilities
  along the path (a predicted path acceptance);
- ``oracle``: the best ``n``-node subtree there is, the matched chain itself (cut at ``n``).

A policy meets only the nodes the logged tree holds: a chain the logged tree did not keep is cut
where it stops, and the replay counts the nodes a policy verifies as they are, so costs follow its
real tree size.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class LoggedTrees:
    """The nodes of many steps, flattened: ``step`` (0..S-1, contiguous), ``parent`` within its step
    (-1 root), ``depth``, ``rank``, and ``match``."""

    step: np.ndarray
    node: np.ndarray
    parent: np.ndarray
    depth: np.ndarray
    rank: np.ndarray
    match: np.ndarray

    def __post_init__(self):
        self.n_steps = int(self.step.max()) + 1 if self.step.size else 0
        starts = np.searchsorted(self.step, np.arange(self.n_steps))
        if np.any(np.diff(self.step) < 0) or np.any(self.node != np.arange(self.step.size) - starts[self.step]):
            raise ValueError("logged trees must be sorted by step and node, nodes numbered 0.. within a step")
        self.gparent = np.where(self.parent >= 0, starts[self.step] + self.parent, -1)
        self.chain_ok = self.closed(self.match.astype(bool))

    def closed(self, own: np.ndarray) -> np.ndarray:
        """``own`` at a node and at every ancestor (parents come before children)."""
        out = own.copy()
        for d in range(1, int(self.depth.max(initial=0)) + 1):
            at = np.flatnonzero(self.depth == d)
            out[at] &= out[self.gparent[at]]
        return out

    def path_product(self, value: np.ndarray) -> np.ndarray:
        """The product of ``value`` from the root's child down to each node."""
        out = value.astype(np.float64).copy()
        for d in range(1, int(self.depth.max(initial=0)) + 1):
            at = np.flatnonzero(self.depth == d)
            out[at] *= out[self.gparent[at]]
        return out

    def top_n(self, score: np.ndarray, n: int) -> np.ndarray:
        """The ``n`` best nodes of each step by ``score`` (ties: shallower, then earlier). Ancestor-closed
        when a child never outscores its parent, as a path product."""
        order = np.lexsort((self.node, self.depth, -score, self.step))
        starts = np.searchsorted(self.step[order], self.step[order], side="left")
        keep = np.zeros(self.step.size, dtype=bool)
        keep[order[np.arange(order.size) - starts < n]] = True
        return keep

    def outcome(self, subtree: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per step: the accepted length and the nodes verified under the subtree mask."""
        acc = np.zeros(self.n_steps, dtype=np.int64)
        hit = subtree & self.chain_ok
        np.maximum.at(acc, self.step[hit], self.depth[hit] + 1)
        size = np.bincount(self.step[subtree], minlength=self.n_steps)
        return acc, size


def chain(trees: LoggedTrees, k: int) -> np.ndarray:
    return trees.closed(trees.rank == 0) & (trees.depth < k)


def static(trees: LoggedTrees, widths: list[int]) -> np.ndarray:
    w = np.asarray(list(widths) + [0], dtype=np.int64)
    return trees.closed(trees.rank < w[np.minimum(trees.depth, len(widths))])


def oracle(trees: LoggedTrees, n: int) -> np.ndarray:
    return trees.chain_ok & (trees.depth < n)
