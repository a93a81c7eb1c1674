"""The per-token statistics the plugin reduces on the device, against numpy references."""

import numpy as np
import pytest
import torch

from svt.vllm_plugin.internals import expand_reference
from svt.vllm_plugin.stats import draft_probs_from_logits, draft_stats, target_stats


def _dists(rng, n, v, mask=0.0):
    logits = rng.normal(size=(n, v)) * 2
    if mask:
        logits[rng.random((n, v)) < mask] = -np.inf
        logits[np.arange(n), rng.integers(0, v, n)] = 0.0  # at least one finite entry per row
    return logits


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_draft_stats_match_numpy():
    rng = np.random.default_rng(0)
    q = _softmax(_dists(rng, 64, 50, mask=0.5))
    tok = rng.integers(0, 50, 64)
    got = draft_stats(torch.tensor(q, dtype=torch.float32), torch.tensor(tok)).numpy()
    s = np.sort(q, -1)[:, ::-1]
    with np.errstate(divide="ignore", invalid="ignore"):
        ent = -np.where(q > 0, q * np.log(q), 0).sum(-1)
    ref = np.stack([s[:, 0], s[:, 0] - s[:, 1], ent, q[np.arange(64), tok]], -1)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
    assert np.isfinite(got).all()  # masked (zero-probability) tokens add nothing to the entropy


def test_target_stats_probabilistic_exact_enumeration():
    """accept_prob = min(1, p/q) of the token; accept_prob_expected = sum_x q(x) min(1, p(x)/q(x))
    (enumerated over the vocabulary) = 1 - TV(p, q)."""
    rng = np.random.default_rng(1)
    logits = _dists(rng, 40, 12, mask=0.3)  # top-p / top-k masks are -inf logits
    q = _softmax(rng.normal(size=(40, 12)))
    tok = rng.integers(0, 12, 40)
    got = target_stats(torch.tensor(logits, dtype=torch.float32), torch.tensor(tok), torch.tensor(q, dtype=torch.float32),
                       torch.zeros(40, dtype=torch.bool)).numpy()
    p = _softmax(logits)
    enum = np.array([sum(q[i, x] * min(1.0, p[i, x] / q[i, x]) for x in range(12)) for i in range(40)])
    np.testing.assert_allclose(got[:, 0], p[np.arange(40), tok], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(got[:, 1], p.max(-1), rtol=1e-5)
    np.testing.assert_allclose(got[:, 2], np.minimum(1, p[np.arange(40), tok] / q[np.arange(40), tok]), rtol=1e-5,
                               atol=1e-7)
    np.testing.assert_allclose(got[:, 3], enum, rtol=1e-5)
    np.testing.assert_allclose(got[:, 3], 1 - 0.5 * np.abs(p - q).sum(-1), rtol=1e-5, atol=1e-6)
    # a token the drafter gave no mass is rejected, as vLLM's kernel does (it needs draft_prob > 0)
    q0 = q.copy()
    q0[0, tok[0]] = 0.0
    zero = target_stats(torch.tensor(logits, dtype=torch.float32), torch.tensor(tok), torch.tensor(q0, dtype=torch.float32),
                        torch.zeros(40, dtype=torch.bool)).numpy()
    assert zero[0, 2] == 0


def test_target_stats_point_mass_and_greedy_rows():
    rng = np.random.default_rng(2)
    logits = _dists(rng, 10, 8)
    tok = np.argmax(logits, -1)
    tok[::2] = (tok[::2] + 1) % 8  # half the drafts disagree with the target's argmax
    greedy = torch.tensor([True, False] * 5)
    got = target_stats(torch.tensor(logits, dtype=torch.float32), torch.tensor(tok), None, greedy).numpy()
    p = _softmax(logits)
    p_tok = p[np.arange(10), tok]
    agree = (tok == logits.argmax(-1)).astype(float)
    # greedy rows: the 0/1 outcome; sampled rows with a point-mass proposal: p(token) both ways
    np.testing.assert_allclose(got[:, 2], np.where(greedy.numpy(), agree, p_tok), rtol=1e-5)
    np.testing.assert_allclose(got[:, 3], np.where(greedy.numpy(), agree, p_tok), rtol=1e-5)
    all_greedy = target_stats(torch.tensor(logits, dtype=torch.float32), torch.tensor(tok), None, None).numpy()
    np.testing.assert_array_equal(all_greedy[:, 2], agree)


def test_draft_probs_from_logits_temperature_per_row():
    logits = torch.tensor([[1.0, 2.0, 0.5], [1.0, 2.0, 0.5], [0.0, 3.0, 1.0], [2.0, 1.0, 0.0]])
    t = torch.tensor([0.5, 0.0])  # two requests, two rows each (parallel drafting); 0 = greedy: T=1
    got = draft_probs_from_logits(logits, t).numpy()
    ref = np.stack([_softmax(logits[0].numpy() / 0.5), _softmax(logits[1].numpy() / 0.5),
                    _softmax(logits[2].numpy()), _softmax(logits[3].numpy())])
    np.testing.assert_allclose(got, ref, rtol=1e-6)
    np.testing.assert_allclose(draft_probs_from_logits(logits, None).numpy(), _softmax(logits.numpy()), rtol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_expand_reference(dtype):
    x = torch.tensor([5.5, 0.0, 2.25]).to(dtype)
    cu = torch.tensor([2, 5, 6])
    got = expand_reference(x, cu, 6, replace_from=0, replace_to=1)
    want = [x[0], x[0], 1, 1, 1, x[2]]
    assert got.tolist() == torch.tensor(want).to(dtype).tolist()


def test_deferred_reduction_equals_per_call():
    """The proposal's distributions reduced in one pass give each call's own statistics."""
    from svt.vllm_plugin import internals

    g = torch.Generator().manual_seed(0)
    calls = [(torch.softmax(torch.randn(6, 30, generator=g), -1), torch.randint(0, 30, (6,), generator=g), None)
             for _ in range(4)]
    want = [draft_stats(p, t) for p, t, _ in calls]
    got = internals._reduce_all(list(calls))
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)
    greedy = [(p, None, p.log()) for p, _, _ in calls]
    for a, b, (p, _, _) in zip(internals._reduce_all(greedy), want, calls, strict=True):
        torch.testing.assert_close(a[:, 3], p.max(-1).values)  # drafted token = argmax
        torch.testing.assert_close(a[:, :3], b[:, :3])  # log-probs given or not: the same entropy
    mixed = internals._reduce_all([calls[0], greedy[1]])
    torch.testing.assert_close(mixed[0], want[0])
    big = list(calls)
    old = internals.DEFER_ELEMENTS
    internals.DEFER_ELEMENTS = 10
    try:
        internals._reduce_if_large(big)
    finally:
        internals.DEFER_ELEMENTS = old
    assert all(isinstance(c, torch.Tensor) for c in big)


def test_the_draft_hook_applies_the_memory_bound(monkeypatch):
    """The hook vLLM's proposer calls once per draft position (no engine: a stand-in proposer and
    original) keeps distributions pending only up to DEFER_ELEMENTS; past it, what is pending is
    reduced to statistics on the spot, equal to the deferred ones."""
    from types import SimpleNamespace

    from svt.vllm_plugin import internals

    g = torch.Generator().manual_seed(1)
    steps = [(torch.randint(0, 50, (4,), generator=g), torch.softmax(torch.randn(4, 50, generator=g), -1))
             for _ in range(5)]
    it = iter(steps)
    monkeypatch.setitem(internals.ORIGINALS, "sample_draft_tokens", lambda self, h, m: next(it))
    proposer = SimpleNamespace(model=SimpleNamespace(compute_logits=lambda *a: None))
    meta = SimpleNamespace(all_greedy=False, temperature=None)

    def propose(bound):
        monkeypatch.setattr(internals, "DEFER_ELEMENTS", bound)
        calls = []
        monkeypatch.setitem(internals._draft, "calls", calls)
        for _ in range(len(steps)):
            internals._sample_draft_tokens(proposer, None, meta)
        return calls

    pending = propose(1 << 24)
    assert all(isinstance(c, tuple) for c in pending)  # under the bound: deferred
    it = iter(steps)
    bounded = propose(3 * 4 * 50)  # three positions' distributions at most
    assert sum(isinstance(c, tuple) for c in bounded) < 3  # reduced as they came
    for a, b in zip(internals._reduce_all(bounded), internals._reduce_all(pending), strict=True):
        torch.testing.assert_close(a, b)


def test_logit_capture_is_undone():
    from svt.vllm_plugin import internals

    class M(torch.nn.Module):
        def compute_logits(self, h):
            return h * 2

    m = M()
    cap = internals._capture_logits(m)
    out = m.compute_logits(torch.ones(2))
    internals._release_logits(m, cap)
    assert len(cap) == 1 and cap[0] is out
    assert "compute_logits" not in vars(m) and m.compute_logits(torch.ones(1)).item() == 2


def test_a_failure_of_the_plugin_is_counted_not_raised(tmp_path, monkeypatch):
    from svt.vllm_plugin import internals, recorder, state

    rec = recorder.Recorder(tmp_path / "t")
    monkeypatch.setattr(state, "_ACTIVE", rec)
    with internals._guard():
        raise ValueError("boom")
    with internals._guard():
        pass
    assert rec.counters["plugin_errors"] == 1 and rec.notes["first_plugin_error"] == "ValueError: boom"
    with pytest.raises(KeyboardInterrupt), internals._guard():  # an interrupt is not the plugin's failure
        raise KeyboardInterrupt


def test_the_plugin_and_the_collector_compute_the_same_draft_statistics():
    """One definition of q_max, q_margin and q_entropy: the plugin's [n, 4] rows equal what svt's
    collector logs and live AV scores (svt.collect.sampling.q_stats), zeros in q included."""
    from svt.collect.sampling import draft_features, q_stats

    g = torch.Generator().manual_seed(3)
    q = torch.softmax(torch.randn(5, 3, 40, generator=g) * 4, -1)
    q[..., :7] = 0.0
    q = q / q.sum(-1, keepdim=True)
    tokens = torch.randint(7, 40, (5, 3), generator=g)
    plugin = draft_stats(q.reshape(15, 40), tokens.reshape(15))
    ours = q_stats(q)
    logged = draft_features(q, q, tokens)
    for j, name in enumerate(("q_max", "q_margin", "q_entropy")):
        assert torch.equal(plugin[:, j], ours[name].reshape(15))
        assert torch.equal(logged[name], ours[name])
    assert torch.equal(plugin[:, 3], logged["q_sampled"].reshape(15))
