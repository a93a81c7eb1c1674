"""Growing a draft tree: static shapes (a branch width per depth) and EAGLE-2's dynamic growth.

A tree hangs below the root (the context, node -1). Node ``i`` has a ``parent`` (-1 for the root's
children), a ``token``, a ``depth`` (0 for the root's children: the chain's position 0) and a sibling
``rank`` (the order verification tries siblings in). A node's children are proposed from the
drafter's distribution at that node, ``dists[node]`` (``dists[-1]`` at the root), either

- ``"sampled"``: i.i.d. draws from it (SpecInfer's multi-candidate proposals; lossless under
  verification against the residual, see `svt.trees.verify`), or
- ``"top"``: its most likely tokens, deterministically (EAGLE's and Medusa's trees); verification
  then treats each candidate as a point mass.

The drafter is any ``q_fn(paths) -> [len(paths), V]``: one draft distribution per token path below
the root (``()`` is the root), batched so a model can score one tree level per forward pass.
Dynamic growth is deterministic (``"top"``): which nodes exist depends on the tokens, and a sampled
token whose survival depends on its own probability would no longer be an i.i.d. draw from q.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from svt.errors import SvtError
from svt.trees.draws import Draws

QFn = Callable[[list[tuple[int, ...]]], np.ndarray]
MODES = ("sampled", "top")


@dataclass
class DraftTree:
    """A draft tree in topological order (every parent before its children)."""

    parent: np.ndarray  # int64 [N], -1 for the root's children
    token: np.ndarray  # int64 [N]
    depth: np.ndarray  # int64 [N], 0-based
    rank: np.ndarray  # int64 [N], 0 = the first sibling verification tries
    path_prob: np.ndarray  # float64 [N], product of the drafter's q(token) along the path
    mode: str
    dists: dict[int, np.ndarray] = field(default_factory=dict)  # node -> q below it; -1 the root

    @property
    def size(self) -> int:
        return int(self.token.size)

    def children(self, node: int) -> np.ndarray:
        """The children of ``node`` (-1: the root) in rank order."""
        kids = np.flatnonzero(self.parent == node)
        return kids[np.argsort(self.rank[kids], kind="stable")]

    def path(self, node: int) -> tuple[int, ...]:
        """The tokens from the root down to ``node`` (``()`` for the root)."""
        out: list[int] = []
        while node >= 0:
            out.append(int(self.token[node]))
            node = int(self.parent[node])
        return tuple(reversed(out))

    def q_at_parent(self) -> np.ndarray:
        """``[N, V]``: the distribution each node was proposed from."""
        return np.stack([self.dists[int(p)] for p in self.parent]) if self.size else np.zeros((0, 0))

    def node_stats(self) -> dict[str, np.ndarray]:
        """Per node: ``q_max`` and ``q_entropy`` of the distribution it was proposed from, and
        ``q_token``, that distribution's probability of the node's token."""
        q = self.q_at_parent()
        if not self.size:
            return {k: np.zeros(0) for k in ("q_max", "q_token", "q_entropy")}
        logq = np.log(np.clip(q, 1e-12, None))
        return {"q_max": q.max(1), "q_token": q[np.arange(self.size), self.token],
                "q_entropy": np.clip(-(q * logq).sum(1), 0.0, None)}

    def check(self) -> None:
        """Structural invariants; raises ValueError on a malformed tree."""
        n = self.size
        if any(a.shape != (n,) for a in (self.parent, self.depth, self.rank, self.path_prob)):
            raise ValueError("tree arrays differ in length")
        for i in range(n):
            p = int(self.parent[i])
            if not -1 <= p < i:
                raise ValueError(f"node {i}: parent {p} is not an earlier node")
            if self.depth[i] != (0 if p < 0 else self.depth[p] + 1):
                raise ValueError(f"node {i}: depth {self.depth[i]} under a parent at depth "
                                 f"{-1 if p < 0 else self.depth[p]}")
            if p not in self.dists:
                raise ValueError(f"node {i}: its parent {p} has no draft distribution")
        for p in {-1, *map(int, self.parent)}:
            ranks = np.sort(self.rank[self.parent == p])
            if not np.array_equal(ranks, np.arange(ranks.size)):
                raise ValueError(f"the children of node {p} have ranks {ranks.tolist()}")


def _mode(mode: str) -> str:
    if mode not in MODES:
        raise SvtError(f"tree proposals are 'sampled' or 'top', not {mode!r}")
    return mode


def _top(q: np.ndarray, m: int) -> np.ndarray:
    """The ``m`` most likely tokens, most likely first (ties: the smaller token id first)."""
    order = np.argsort(-q, kind="stable")
    return order[:m]


def grow_static(widths: Sequence[int], q_fn: QFn, mode: str = "top", draws: Draws | None = None) -> DraftTree:
    """A tree where every node at depth ``d`` has ``widths[d]`` children (``widths[0]`` below the
    root). ``widths == [1] * K`` is the chain of K drafts."""
    mode = _mode(mode)
    if not widths or any(int(w) < 1 for w in widths):
        raise SvtError(f"tree widths must be a non-empty list of positive integers, got {list(widths)}")
    if mode == "sampled" and draws is None:
        raise SvtError("sampled tree proposals need draws")
    parent: list[int] = []
    token: list[int] = []
    depth: list[int] = []
    rank: list[int] = []
    prob: list[float] = []
    dists: dict[int, np.ndarray] = {}
    frontier, paths, probs = [-1], [()], [1.0]
    for d, width in enumerate(int(w) for w in widths):
        q = np.asarray(q_fn(list(paths)), dtype=np.float64)
        nxt, nxt_paths, nxt_probs = [], [], []
        for node, path, pp, qn in zip(frontier, paths, probs, q, strict=True):
            dists[node] = qn
            kids = _top(qn, width) if mode == "top" else [draws.sample(qn) for _ in range(width)]
            for r, tok in enumerate(kids):
                tok = int(tok)
                parent.append(node)
                token.append(tok)
                depth.append(d)
                rank.append(r)
                prob.append(pp * float(qn[tok]))
                nxt.append(len(token) - 1)
                nxt_paths.append((*path, tok))
                nxt_probs.append(prob[-1])
        frontier, paths, probs = nxt, nxt_paths, nxt_probs
    return _tree(parent, token, depth, rank, prob, mode, dists)


def grow_dynamic(q_fn: QFn, top_m: int, depth: int, n_nodes: int) -> DraftTree:
    """EAGLE-2's growth (Li et al., 2024): at each depth, the ``top_m`` nodes of the newest level with
    the highest path probability are expanded, each by its ``top_m`` most likely tokens; then all
    grown nodes are reranked by path probability and the best ``n_nodes`` kept. A child's path
    probability never exceeds its parent's, so the kept set holds every kept node's ancestors
    (ties: shallower first)."""
    if top_m < 1 or depth < 1 or n_nodes < 1:
        raise SvtError(f"dynamic trees need top_m, depth and n_nodes >= 1 (got {top_m}, {depth}, {n_nodes})")
    parent: list[int] = []
    token: list[int] = []
    dep: list[int] = []
    rank: list[int] = []
    prob: list[float] = []
    dists: dict[int, np.ndarray] = {}
    level, paths = [-1], {-1: ()}
    pprob = {-1: 1.0}
    for d in range(depth):
        if d > 0:  # expand the newest level's best top_m nodes
            level = sorted(level, key=lambda i: (-prob[i], i))[:top_m]
        q = np.asarray(q_fn([paths[i] for i in level]), dtype=np.float64)
        new = []
        for node, qn in zip(level, q, strict=True):
            dists[node] = qn
            for r, tok in enumerate(_top(qn, top_m)):
                tok = int(tok)
                parent.append(node)
                token.append(tok)
                dep.append(d)
                rank.append(r)
                prob.append(pprob[node] * float(qn[tok]))
                i = len(token) - 1
                paths[i], pprob[i] = (*paths[node], tok), prob[-1]
                new.append(i)
        level = new
    keep = sorted(range(len(token)), key=lambda i: (-prob[i], dep[i], i))[:n_nodes]
    keep_set = set(keep)
    for i in keep:  # guaranteed by monotone path probabilities; checked, not assumed
        if parent[i] >= 0 and parent[i] not in keep_set:
            raise AssertionError("EAGLE-2 rerank dropped an ancestor of a kept node")
    keep.sort()  # topological: parents were appended before children
    new_id = {-1: -1, **{old: new for new, old in enumerate(keep)}}
    kept_parent = [new_id[parent[i]] for i in keep]
    # ranks among the kept siblings, in the order of their original ranks
    kept_rank = []
    for j, i in enumerate(keep):
        kept_rank.append(sum(1 for jj, ii in enumerate(keep) if kept_parent[jj] == kept_parent[j]
                             and rank[ii] < rank[i]))
    kept_dists = {new_id[n]: q for n, q in dists.items() if n in new_id}
    return _tree(kept_parent, [token[i] for i in keep], [dep[i] for i in keep], kept_rank,
                 [prob[i] for i in keep], "top", kept_dists)


def _tree(parent, token, depth, rank, prob, mode, dists) -> DraftTree:
    tree = DraftTree(parent=np.asarray(parent, dtype=np.int64), token=np.asarray(token, dtype=np.int64),
                     depth=np.asarray(depth, dtype=np.int64), rank=np.asarray(rank, dtype=np.int64),
                     path_prob=np.asarray(prob, dtype=np.float64), mode=mode, dists=dists)
    tree.check()
    return tree
