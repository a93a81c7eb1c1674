"""Tree verification: exact enumeration of every random choice shows the emitted tokens follow the
target; hand-built trees pin the labels; a chi-square check with real randomness has power."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy import stats

from svt.trees import grow_dynamic, grow_static, verify_greedy, verify_sampling
from svt.trees.draws import Draws
from svt.trees.grow import DraftTree

V = 3


def _dist(seed: int, v: int = V, peaked: float = 1.5) -> np.ndarray:
    x = np.random.default_rng(seed).gamma(peaked, size=v)
    return x / x.sum()


def _model(salt: int, v: int = V):
    """A fixed autoregressive 'model': the next-token distribution of every context."""
    cache: dict[tuple[int, ...], np.ndarray] = {}

    def fn(path: tuple[int, ...]) -> np.ndarray:
        if path not in cache:
            cache[path] = _dist(hash((salt, path)) % 2**32, v)
        return cache[path]

    return fn


def q_batch(model):
    return lambda paths: np.stack([model(p) for p in paths])


def target_rows(tree: DraftTree, target) -> np.ndarray:
    return np.stack([target(())] + [target(tree.path(i)) for i in range(tree.size)])


class Forced(Draws):
    """Draws that follow a script of choices, recording every branching point and its odds."""

    def __init__(self, script: list[int]):
        self.script, self.made, self.options, self.prob = script, [], [], 1.0

    def _choose(self, probs: list[float]) -> int:
        j = len(self.made)
        c = self.script[j] if j < len(self.script) else next(i for i, w in enumerate(probs) if w > 0)
        self.made.append(c)
        self.options.append(probs)
        self.prob *= probs[c]
        return c

    def accept(self, prob: float) -> bool:
        return self._choose([prob, 1.0 - prob]) == 0

    def sample(self, probs) -> int:
        probs = np.asarray(probs, dtype=np.float64)
        return self._choose(list(probs / probs.sum()))


def enumerate_runs(run):
    """Every outcome of ``run(draws)`` with its exact probability (zero-probability branches pruned)."""
    stack: list[list[int]] = [[]]
    while stack:
        script = stack.pop()
        d = Forced(script)
        out = run(d)
        for j in range(len(script), len(d.made)):
            for alt, w in enumerate(d.options[j]):
                if alt != d.made[j] and w > 0:
                    stack.append(d.made[:j] + [alt])
        yield out, d.prob


def emitted_joint(run, target, length: int) -> dict[tuple[int, ...], float]:
    """The exact distribution of the first ``length`` emitted tokens, continuing short outcomes
    with the target itself (what the next step would do, in distribution)."""
    joint: dict[tuple[int, ...], float] = {}

    def extend(seq, w):
        if len(seq) >= length:
            joint[seq[:length]] = joint.get(seq[:length], 0.0) + w
            return
        for x, px in enumerate(target(seq)):
            extend((*seq, x), w * px)

    total = 0.0
    for seq, w in enumerate_runs(run):
        total += w
        extend(tuple(seq), w)
    assert total == pytest.approx(1.0, abs=1e-12)
    return joint


def exact_target(target, length: int) -> dict[tuple[int, ...], float]:
    out = {}
    for seq in itertools.product(range(len(target(()))), repeat=length):
        w = 1.0
        for i, x in enumerate(seq):
            w *= target(seq[:i])[x]
        out[seq] = w
    return out


def _step(widths, mode, target, draft):
    def run(d):
        tree = grow_static(widths, q_batch(draft), mode, d)
        return verify_sampling(tree, target_rows(tree, target), d).tokens(tree)
    return run


@pytest.mark.parametrize("widths,mode", [([3], "sampled"), ([2, 2], "sampled"), ([2, 1, 1], "sampled"),
                                         ([3, 2], "top"), ([2, 3, 1], "top")])
def test_static_trees_emit_the_target_exactly(widths, mode):
    target, draft = _model(1), _model(2)
    length = len(widths) + 1
    joint = emitted_joint(_step(widths, mode, target, draft), target, length)
    expected = exact_target(target, length)
    assert set(joint) <= set(expected)
    for seq, w in expected.items():
        assert joint.get(seq, 0.0) == pytest.approx(w, abs=1e-12), seq


def test_dynamic_trees_emit_the_target_exactly():
    target, draft = _model(3), _model(4)

    def run(d):
        tree = grow_dynamic(q_batch(draft), top_m=2, depth=3, n_nodes=6)
        return verify_sampling(tree, target_rows(tree, target), d).tokens(tree)

    joint = emitted_joint(run, target, 4)
    for seq, w in exact_target(target, 4).items():
        assert joint.get(seq, 0.0) == pytest.approx(w, abs=1e-12), seq


def test_the_enumeration_catches_a_lossy_verifier():
    """Accepting sampled siblings against p instead of the residual (the classic multi-candidate
    bug) changes the emitted distribution, and the exact check sees it."""
    target, draft = _model(1), _model(2)

    def lossy(d):
        tree = grow_static([3], q_batch(draft), "sampled", d)
        p = target_rows(tree, target)
        for child in tree.children(-1):  # every sibling tried against the untouched target
            x = int(tree.token[child])
            if d.accept(min(1.0, p[0][x] / tree.dists[-1][x])):
                return [x, d.sample(p[1 + child])]
        return [d.sample(p[0])]

    joint = emitted_joint(lossy, target, 2)
    gap = max(abs(joint.get(s, 0.0) - w) for s, w in exact_target(target, 2).items())
    assert gap > 1e-3


def test_chain_tree_matches_chain_speculative_sampling():
    """widths [1, 1] is the chain: the first draft's acceptance probability is min(1, p/q)."""
    target, draft = _model(5), _model(6)
    tree = grow_static([1, 1], q_batch(draft), "sampled", Draws(0))
    out = verify_sampling(tree, target_rows(tree, target), Draws(1))
    x = int(tree.token[0])
    assert out.accept_prob[0] == pytest.approx(min(1.0, target(())[x] / draft(())[x]))


def _hand_tree(mode="top") -> DraftTree:
    """root -> a(0) [rank 0], b(1) [rank 1]; a -> c(2); b -> d(0)."""
    q_root = np.array([0.5, 0.3, 0.2])
    return DraftTree(parent=np.array([-1, -1, 0, 1]), token=np.array([0, 1, 2, 0]),
                     depth=np.array([0, 0, 1, 1]), rank=np.array([0, 1, 0, 0]),
                     path_prob=np.array([0.5, 0.3, 0.1, 0.15]), mode=mode,
                     dists={-1: q_root, 0: np.array([0.1, 0.1, 0.8]), 1: np.array([0.5, 0.25, 0.25])})


def test_greedy_labels_on_a_hand_built_tree():
    tree = _hand_tree()
    tree.check()
    # target argmax: root -> 1 (b), below a -> 2, below b -> 2 (d=0 wrong), below c, d -> 0
    p = np.array([[0.2, 0.7, 0.1], [0.1, 0.1, 0.8], [0.3, 0.1, 0.6], [0.6, 0.2, 0.2], [0.5, 0.3, 0.2]])
    out = verify_greedy(tree, p)
    assert out.path == [1]
    assert out.label.tolist() == [0, 1, -1, 0]
    assert out.next_token == 2  # argmax below b
    assert out.match.tolist() == [False, True, True, False]  # c would pass were a accepted
    assert out.tokens(tree) == [1, 2]


def test_sampling_labels_on_a_hand_built_tree():
    """Point-mass siblings: a is rejected w.p. 1 - p(0); then b accepted w.p. r(1) where r is p
    without 0, renormalised; below b, d is tried; c is never reached."""
    tree = _hand_tree("top")
    p = np.array([[0.0, 0.6, 0.4], [0.1, 0.1, 0.8], [1.0, 0.0, 0.0], [0.3, 0.1, 0.6], [0.5, 0.3, 0.2]])
    seen = set()
    for seed in range(40):
        out = verify_sampling(tree, p, Draws(seed))
        assert out.accept_prob[0] == 0.0 and out.label[0] == 0  # p(0) = 0 at the root
        assert out.accept_prob[1] == pytest.approx(0.6)
        assert np.isnan(out.accept_prob[2]) and out.label[2] == -1  # below the rejected a
        if out.label[1] == 1:  # below b, d (token 0) has p = 1
            assert out.accept_prob[3] == 1.0 and out.label[3] == 1 and out.path == [1, 3]
        else:  # b rejected: the residual is the point mass on 2
            assert out.label[3] == -1 and out.path == [] and out.next_token == 2
        seen.add(int(out.label[1]))
    assert seen == {0, 1}


def test_siblings_after_the_accepted_one_are_not_reached():
    tree = _hand_tree("top")
    p = np.array([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0], [0.3, 0.1, 0.6], [1.0, 0.0, 0.0], [0.5, 0.3, 0.2]])
    out = verify_sampling(tree, p, Draws(0))
    assert out.label.tolist() == [1, -1, 1, -1]
    assert out.path == [0, 2]


def test_sampled_verification_with_real_draws_passes_chi_square_and_has_power():
    target, draft = _model(7, v=4), _model(8, v=4)
    n = 10_000
    draws = Draws(11)
    first, naive = [], []
    for _ in range(n):
        tree = grow_static([3, 1], q_batch(draft), "sampled", draws)
        out = verify_sampling(tree, target_rows(tree, target), draws)
        first.append(out.tokens(tree)[0])
        naive.append(int(tree.token[0]))  # "accept the first draft": emits q, not p
    p0 = target(())
    counts = np.bincount(first, minlength=4)
    assert stats.chisquare(counts, p0 * n).pvalue > 1e-3
    assert stats.chisquare(np.bincount(naive, minlength=4), p0 * n).pvalue < 1e-12


def _greedy_rollout(target, length: int) -> list[int]:
    seq: list[int] = []
    for _ in range(length):
        seq.append(int(np.argmax(target(tuple(seq)))))
    return seq


@pytest.mark.parametrize("seed", range(30))
def test_greedy_takes_the_deepest_matched_path_among_repeated_siblings(seed):
    """Sampled siblings repeat tokens (V = 3, width 3): the accepted path must be the deepest chain
    of nodes that each carry the target's argmax, and the emitted tokens its greedy rollout."""
    target, draft = _model(100 + seed), _model(200 + seed)
    tree = grow_static([3, 3, 2], q_batch(draft), "sampled", Draws(seed))
    out = verify_greedy(tree, target_rows(tree, target))
    greedy = _greedy_rollout(target, 5)
    deepest = max((len(tree.path(i)) for i in range(tree.size)
                   if list(tree.path(i)) == greedy[:len(tree.path(i))]), default=0)
    assert len(out.path) == deepest
    assert out.tokens(tree) == greedy[:deepest + 1]
    assert (out.label == 1).sum() == deepest
