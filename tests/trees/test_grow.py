"""Tree growth against hand-computed trees: static widths, EAGLE-2's expansion and rerank."""

from __future__ import annotations

import numpy as np
import pytest

from svt.errors import SvtError
from svt.trees import grow_dynamic, grow_static
from svt.trees.draws import Draws

Q = {(): [0.5, 0.3, 0.15, 0.05], (0,): [0.4, 0.4, 0.1, 0.1], (1,): [0.6, 0.3, 0.05, 0.05]}
DEFAULT = [0.7, 0.1, 0.1, 0.1]


def q_fn(paths):
    return np.array([Q.get(p, DEFAULT) for p in paths], dtype=np.float64)


def _nodes(tree):
    return [(tree.path(i), int(tree.rank[i]), round(float(tree.path_prob[i]), 12)) for i in range(tree.size)]


def test_eagle2_growth_expands_the_best_paths_and_keeps_the_best_nodes():
    """Depth 1 holds (0,0) .2, (0,1) .2, (1,0) .18, (1,1) .09: the two best by path probability,
    (0,0) and (0,1), are expanded (not (1,0), whose own q .6 is the highest); the rerank keeps the
    7 best of all 10 grown nodes, ties to the earlier grown."""
    tree = grow_dynamic(q_fn, top_m=2, depth=3, n_nodes=7)
    assert _nodes(tree) == [((0,), 0, 0.5), ((1,), 1, 0.3), ((0, 0), 0, 0.2), ((0, 1), 1, 0.2),
                            ((1, 0), 0, 0.18), ((0, 0, 0), 0, 0.14), ((0, 1, 0), 0, 0.14)]
    assert tree.depth.tolist() == [0, 0, 1, 1, 1, 2, 2]
    assert tree.mode == "top"
    expanded = {tree.path(n) if n >= 0 else () for n in tree.dists}
    assert expanded == {(), (0,), (1,), (0, 0), (0, 1)}
    stats = tree.node_stats()
    assert stats["q_token"].tolist() == pytest.approx([0.5, 0.3, 0.4, 0.4, 0.6, 0.7, 0.7])
    assert stats["q_max"][2] == pytest.approx(0.4)


def test_eagle2_rerank_renumbers_sibling_ranks():
    tree = grow_dynamic(q_fn, top_m=3, depth=2, n_nodes=4)
    # grown: (0,) .5, (1,) .3, (2,) .15, (0,0) .2, (0,1) .2, (0,2) .05, (1,0) .18, ...; kept 4:
    assert _nodes(tree) == [((0,), 0, 0.5), ((1,), 1, 0.3), ((0, 0), 0, 0.2), ((0, 1), 1, 0.2)]


def test_static_top_tree():
    tree = grow_static([2, 1], q_fn, "top")
    assert _nodes(tree) == [((0,), 0, 0.5), ((1,), 1, 0.3), ((0, 0), 0, 0.2), ((1, 0), 0, 0.18)]


def test_static_sampled_tree_draws_each_child_from_its_parent():
    counts = np.zeros((2, 4))
    draws = Draws(3)
    for _ in range(3000):
        tree = grow_static([2, 1], q_fn, "sampled", draws)
        assert tree.size == 4 and tree.rank.tolist() == [0, 1, 0, 0]
        for i in (2, 3):
            parent_tok = int(tree.token[tree.parent[i]])
            if parent_tok in (0, 1):
                counts[parent_tok, tree.token[i]] += 1
    for tok in (0, 1):
        freq = counts[tok] / counts[tok].sum()
        assert np.abs(freq - np.array(Q[(tok,)])).max() < 0.05


@pytest.mark.parametrize("call", [lambda: grow_static([], q_fn), lambda: grow_static([2, 0], q_fn),
                                  lambda: grow_static([2], q_fn, "beam"), lambda: grow_static([2], q_fn, "sampled"),
                                  lambda: grow_dynamic(q_fn, 0, 2, 4)])
def test_bad_shapes_are_refused(call):
    with pytest.raises(SvtError):
        call()
