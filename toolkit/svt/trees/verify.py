"""Verifying a draft tree against the target: labels for every node and the tokens the step emits.

``p`` holds the target's distribution below the root and below every node (``p[0]`` the root,
``p[1 + i]`` node ``i``), as one forward pass over the tree with a tree attention mask gives them.

Sampling (SpecInfer's multi-candidate speculative sampling, Miao et al., 2024): starting at the
root with ``r = p[root]``, the children are tried in rank order; child ``x`` proposed from ``g`` is
accepted with probability ``min(1, r(x) / g(x))``, and a rejection replaces ``r`` with the residual
``norm(max(0, r - g))``. The proposal ``g`` is the drafter's q at the parent for i.i.d. sampled
children and a point mass on ``x`` for deterministic ("top") children. An accepted child becomes
the new root with ``r = p[child]``; when every child is rejected (or the node is a leaf) the next
token is drawn from ``r``. Each round is ordinary speculative sampling of ``r`` against ``g``, so
the emitted tokens follow the target exactly.

Greedy: the child whose token is the target's argmax is accepted; when sampled siblings repeat that
token, the one whose matched chain below it is deepest (the first in rank order among equals), since
every matched chain is the target's own greedy continuation. The next token is the target's argmax
where the path stops.

Labels: 1 on the accepted path, 0 verified and rejected, -1 never reached (siblings after the
accepted one under sampling, everything below a rejected node). Greedy verification also tells, for
every node, whether its token is the target's argmax at its parent (``match``): the label a node
would get were its parent accepted.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from svt.trees.draws import Draws
from svt.trees.grow import DraftTree

ACCEPTED, REJECTED, NOT_REACHED = 1, 0, -1


@dataclass
class TreeOutcome:
    path: list[int]  # accepted nodes, root to deepest
    next_token: int  # resampled after the last rejection, or the bonus below the path
    label: np.ndarray  # int8 [N]: 1 accepted, 0 rejected, -1 not reached
    accept_prob: np.ndarray  # float64 [N]: the probability verification accepted it with (nan: not tried)
    match: np.ndarray | None = None  # bool [N], greedy only

    def tokens(self, tree: DraftTree) -> list[int]:
        """Every token the step emits: the accepted path, then ``next_token``."""
        return [int(tree.token[i]) for i in self.path] + [self.next_token]


def _check_p(tree: DraftTree, p: np.ndarray) -> np.ndarray:
    p = np.asarray(p, dtype=np.float64)
    if p.ndim != 2 or p.shape[0] != tree.size + 1:
        raise ValueError(f"target distributions {p.shape} for a tree of {tree.size} nodes (need {tree.size + 1} rows)")
    return p


def verify_sampling(tree: DraftTree, p: np.ndarray, draws: Draws) -> TreeOutcome:
    p = _check_p(tree, p)
    label = np.full(tree.size, NOT_REACHED, dtype=np.int8)
    accept_prob = np.full(tree.size, np.nan)
    path: list[int] = []
    node, r = -1, p[0]
    while True:
        taken = None
        for child in tree.children(node):
            x = int(tree.token[child])
            if tree.mode == "sampled":
                g = tree.dists[node]
            else:
                g = np.zeros_like(r)
                g[x] = 1.0
            a = min(1.0, r[x] / g[x]) if g[x] > 0 else 0.0
            accept_prob[child] = a
            if draws.accept(a):
                label[child] = ACCEPTED
                taken = int(child)
                break
            label[child] = REJECTED
            residual = np.clip(r - g, 0.0, None)
            mass = residual.sum()
            # a rejection implies r(x) < g(x), so the residual has mass; guard float round-off
            r = residual / mass if mass > 0 else r
        if taken is None:
            return TreeOutcome(path, draws.sample(r), label, accept_prob)
        path.append(taken)
        node, r = taken, p[1 + taken]


def verify_greedy(tree: DraftTree, p: np.ndarray) -> TreeOutcome:
    p = _check_p(tree, p)
    top = p.argmax(1)  # the target's greedy token below the root and each node
    match = tree.token == top[1 + tree.parent]
    reach = match.astype(np.int64)  # matched nodes on the deepest matched chain from each node down
    for i in range(tree.size - 1, -1, -1):  # parents precede children
        par = int(tree.parent[i])
        if par >= 0 and match[par]:
            reach[par] = max(reach[par], 1 + reach[i])
    label = np.full(tree.size, NOT_REACHED, dtype=np.int8)
    accept_prob = np.full(tree.size, np.nan)
    path: list[int] = []
    node = -1
    while True:
        kids = tree.children(node)
        label[kids] = REJECTED
        accept_prob[kids] = match[kids].astype(np.float64)
        hits = kids[match[kids]]
        if hits.size == 0:
            return TreeOutcome(path, int(top[1 + node]), label, accept_prob, match)
        node = int(hits[np.argmax(reach[hits])])  # argmax: the first among the deepest
        label[node] = ACCEPTED
        path.append(node)


def oracle_tree_labels(parent: np.ndarray, token: np.ndarray, continuation: np.ndarray) -> np.ndarray:
    """Greedy verification of a tree against the target's real continuation, per node: 1 on the
    accepted path, 0 tried and rejected (its parent accepted, its token not the next one), -1 not
    reached (under a node not accepted, or deeper than the response goes). Among siblings the first
    matching node is accepted, as arctic-inference's simulator walks them. The accepted length is
    ``(labels == 1).sum()``.

    >>> oracle_tree_labels(np.array([-1, -1, 0, 1]), np.array([5, 6, 7, 8]), np.array([6, 8, 9])).tolist()
    [0, 1, -1, 1]
    """
    n = token.size
    labels = np.full(n, -1, dtype=np.int64)
    taken: set[int] = set()  # parents (-1: the root) whose accepted child is found
    for i in range(n):
        p = int(parent[i])
        if p >= 0 and labels[p] != 1:
            continue
        depth = 0 if p < 0 else _depth(parent, i)
        if depth >= continuation.size or p in taken:
            labels[i] = -1 if depth >= continuation.size else 0
            continue
        labels[i] = int(token[i] == continuation[depth])
        if labels[i]:
            taken.add(p)
    return labels


def _depth(parent: np.ndarray, i: int) -> int:
    d = 0
    while parent[i] >= 0:
        i, d = int(parent[i]), d + 1
    return d
