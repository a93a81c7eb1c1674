"""Replaying tree policies on logged greedy trees: every policy's accepted length equals greedy
verification of its subtree (checked against `verify_greedy` on random trees), and hand-built
trees pin each policy's choice."""

from __future__ import annotations

import numpy as np
import pytest

from svt.trees import DraftTree, grow_dynamic, grow_static, verify_greedy
from svt.trees import replay as rp
from svt.trees.draws import Draws


def _flatten(trees: list[DraftTree], matches: list[np.ndarray]) -> rp.LoggedTrees:
    cat = lambda xs: np.concatenate(xs).astype(np.int64)  # noqa: E731
    return rp.LoggedTrees(cat([np.full(t.size, i) for i, t in enumerate(trees)]), cat([np.arange(t.size) for t in trees]),
                          cat([t.parent for t in trees]), cat([t.depth for t in trees]), cat([t.rank for t in trees]),
                          np.concatenate(matches).astype(bool))


def _subtree(tree: DraftTree, keep: np.ndarray) -> DraftTree:
    idx = np.flatnonzero(keep)
    new = {-1: -1, **{int(o): n for n, o in enumerate(idx)}}
    ranks = np.zeros(idx.size, dtype=np.int64)
    par = np.array([new[int(tree.parent[i])] for i in idx], dtype=np.int64)
    for p in set(par.tolist()):
        kids = np.flatnonzero(par == p)
        ranks[kids[np.argsort(tree.rank[idx[kids]], kind="stable")]] = np.arange(kids.size)
    return DraftTree(parent=par, token=tree.token[idx], depth=tree.depth[idx], rank=ranks,
                     path_prob=tree.path_prob[idx], mode=tree.mode, dists={new[k]: v for k, v in tree.dists.items()
                                                                             if k in new})


def _random_case(seed: int, v: int = 4):
    rng = np.random.default_rng(seed)
    table: dict = {}

    def dist(path):
        if path not in table:
            x = rng.gamma(0.6, size=v)
            table[path] = x / x.sum()
        return table[path]

    q_fn = lambda paths: np.stack([dist(("q", *p)) for p in paths])  # noqa: E731
    tree = (grow_dynamic(q_fn, 3, 4, 12) if seed % 2 else grow_static([3, 2, 2], q_fn, "top", Draws(seed)))
    p = np.stack([dist(("p",))] + [dist(("p", *tree.path(i))) for i in range(tree.size)])
    out = verify_greedy(tree, p)
    return tree, p, out


def test_every_policy_matches_greedy_verification_of_its_subtree():
    cases = [_random_case(s) for s in range(40)]
    trees = [c[0] for c in cases]
    logged = _flatten(trees, [c[2].match for c in cases])
    starts = np.searchsorted(logged.step, np.arange(len(trees)))
    score = logged.path_product(np.concatenate([t.node_stats()["q_token"] for t in trees]))
    np.testing.assert_allclose(score, np.concatenate([t.path_prob for t in trees]))
    masks = [rp.chain(logged, 2), rp.chain(logged, 4), rp.static(logged, [2, 1, 1]), rp.static(logged, [3, 2]),
             logged.top_n(score, 5), logged.top_n(score, 1), np.ones(logged.step.size, dtype=bool)]
    for mask in masks:
        acc, size = logged.outcome(mask)
        for i, (tree, p, _) in enumerate(cases):
            keep = mask[starts[i]:starts[i] + tree.size]
            sub = _subtree(tree, keep)
            sub.check()  # every policy's choice is ancestor-closed
            assert acc[i] == len(verify_greedy(sub, p[np.r_[0, 1 + np.flatnonzero(keep)]]).path)
            assert size[i] == keep.sum()
    full, _ = logged.outcome(np.ones(logged.step.size, dtype=bool))
    assert full.tolist() == [len(c[2].path) for c in cases]
    assert full.max() >= 2  # the cases reach depth: the check above has something to check


def test_policies_on_a_hand_built_tree():
    """root -> a (rank 0, matched), b (rank 1); a -> c (rank 0), d (rank 1, matched); d -> e (matched)."""
    tree = rp.LoggedTrees(step=np.zeros(5, dtype=np.int64), node=np.arange(5), parent=np.array([-1, -1, 0, 0, 3]),
                          depth=np.array([0, 0, 1, 1, 2]), rank=np.array([0, 1, 0, 1, 0]),
                          match=np.array([1, 0, 0, 1, 1], dtype=bool))
    assert tree.chain_ok.tolist() == [True, False, False, True, True]
    assert tree.outcome(rp.chain(tree, 3))[0].tolist() == [1]  # a, then c fails
    assert rp.chain(tree, 3).tolist() == [True, False, True, False, False]
    assert tree.outcome(rp.static(tree, [1, 2, 1]))[0].tolist() == [3]  # a, d, e
    assert tree.outcome(rp.static(tree, [2, 1]))[0].tolist() == [1]
    assert tree.outcome(rp.oracle(tree, 2))[0].tolist() == [2]
    assert tree.outcome(rp.oracle(tree, 2))[1].tolist() == [2]
    score = np.array([0.9, 0.1, 0.5, 0.3, 0.2])
    assert tree.top_n(score, 3).tolist() == [True, False, True, True, False]
    assert tree.outcome(tree.top_n(score, 3))[0].tolist() == [2]


def test_logged_trees_must_be_in_order():
    with pytest.raises(ValueError, match="sorted"):
        rp.LoggedTrees(step=np.array([0, 0]), node=np.array([1, 0]), parent=np.array([-1, -1]),
                       depth=np.zeros(2, dtype=np.int64), rank=np.array([0, 1]), match=np.zeros(2, dtype=bool))
