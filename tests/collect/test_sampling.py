"""The accept/resample step and processed distributions, on hand-made p and q."""

import math

import numpy as np
import pytest
import torch
from scipy import stats

from svt.collect.sampling import draft_features, process_probs, sample_tokens, verify

ALPHA = 1e-4  # fixed seeds make each test deterministic; a real bug gives p-values ~ 0


def chi2_pvalue(samples: np.ndarray, probs: np.ndarray) -> float:
    probs = np.asarray(probs, dtype=np.float64)
    probs = probs / probs.sum()
    counts = np.bincount(samples, minlength=len(probs)).astype(float)
    expected = probs * len(samples)
    keep = expected > 0
    assert counts[~keep].sum() == 0, "sampled a token with probability 0"
    return stats.chisquare(counts[keep], expected[keep]).pvalue


def test_process_probs_temperature_is_scaled_softmax():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    got = process_probs(logits, 0.7, 1.0)
    torch.testing.assert_close(got, torch.softmax(logits / 0.7, -1))
    # temperature 0 (greedy) describes the unscaled softmax
    torch.testing.assert_close(process_probs(logits, 0.0, 0.5), torch.softmax(logits, -1))


@pytest.mark.parametrize(
    "top_p, expected",
    [
        (0.7, [0.625, 0.375, 0.0, 0.0]),  # 0.5 + 0.3 reaches 0.7: keep two
        (0.8, [0.625, 0.375, 0.0, 0.0]),  # mass before the third is exactly 0.8: not needed
        (0.81, [0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0.0]),
        (0.4, [1.0, 0.0, 0.0, 0.0]),  # the token that crosses the threshold is kept
        (1.0, [0.5, 0.3, 0.15, 0.05]),
    ],
)
def test_top_p_keeps_the_smallest_set_reaching_p(top_p, expected):
    probs = torch.tensor([[0.3, 0.05, 0.5, 0.15]], dtype=torch.float64)
    logits = probs.log()
    got = process_probs(logits, 1.0, top_p)[0].double()
    order = [2, 0, 3, 1]  # the hand-made expectation is sorted by probability
    np.testing.assert_allclose(got[order].numpy(), expected, atol=1e-6)


def test_features_hand_computed():
    q = torch.tensor([[[0.5, 0.3, 0.2]]])
    p = torch.tensor([[[0.2, 0.5, 0.3]]])
    f = {k: v.item() for k, v in draft_features(q, p, torch.tensor([[0]])).items()}
    assert f["q_max"] == pytest.approx(0.5)
    assert f["q_sampled"] == pytest.approx(0.5)
    assert f["q_margin"] == pytest.approx(0.2)
    assert f["q_entropy"] == pytest.approx(-(0.5 * math.log(0.5) + 0.3 * math.log(0.3) + 0.2 * math.log(0.2)))
    assert f["p_sampled"] == pytest.approx(0.2)
    assert f["p_max"] == pytest.approx(0.5)
    assert f["accept_prob"] == pytest.approx(0.4)  # min(1, 0.2 / 0.5)
    assert f["accept_prob_expected"] == pytest.approx(0.7)  # 0.2 + 0.3 + 0.2 = 1 - TV


def _run_verify(p, q, n, seed):
    """Draw drafts from q for n rows, verify; return tokens, result."""
    g = torch.Generator().manual_seed(seed)
    B = n
    K, V = q.shape
    qb = q.expand(B, K, V).contiguous()
    pb = p.expand(B, K + 1, V).contiguous()
    toks = torch.multinomial(qb.reshape(-1, V), 1, generator=g).reshape(B, K)
    return toks, verify(pb, qb, toks, greedy=False, generator=g)


def test_seed_example_single_position():
    """p = [0.5, 0.5], q = [0.2, 0.8]: x=0 always accepted, x=1 accepted w.p. 0.625; output ~ p."""
    p = torch.tensor([[0.5, 0.5], [0.5, 0.5]])
    q = torch.tensor([[0.2, 0.8]])
    toks, res = _run_verify(p, q, 200_000, seed=1)
    first = torch.where(res.accepted >= 1, toks[:, 0], res.next_token).numpy()
    assert chi2_pvalue(first, np.array([0.5, 0.5])) > ALPHA
    x = toks[:, 0]
    assert res.label_ok[x == 0].all()
    rate = res.label_ok[x == 1].float().mean().item()
    n1 = int((x == 1).sum())
    assert stats.binomtest(int(res.label_ok[x == 1].sum()), n1, 0.625).pvalue > ALPHA, rate
    # after a rejection of x=1 the residual norm(max(0, p - q)) is the point mass on 0
    assert (res.next_token[(x == 1) & (res.accepted == 0)] == 0).all()


def test_every_emitted_position_follows_p():
    """K = 2, V = 4: token 1 ~ p0; token 2 given an accepted first draft ~ p1; bonus ~ p2."""
    p = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.4, 0.3, 0.2, 0.1], [0.25, 0.05, 0.6, 0.1]])
    q = torch.tensor([[0.4, 0.1, 0.4, 0.1], [0.1, 0.6, 0.1, 0.2]])
    toks, res = _run_verify(p, q, 400_000, seed=2)
    acc, nxt = res.accepted, res.next_token
    first = torch.where(acc >= 1, toks[:, 0], nxt)
    assert chi2_pvalue(first.numpy(), p[0].numpy()) > ALPHA
    reached = acc >= 1
    second = torch.where(acc >= 2, toks[:, 1], nxt)[reached]
    assert chi2_pvalue(second.numpy(), p[1].numpy()) > ALPHA
    bonus = nxt[acc == 2]
    assert chi2_pvalue(bonus.numpy(), p[2].numpy()) > ALPHA
    # the acceptance rate at position 0 is sum min(p, q) = 1 - TV
    expected = torch.minimum(p[0], q[0]).sum().item()
    assert stats.binomtest(int(reached.sum()), len(acc), expected).pvalue > ALPHA


def test_the_chi_square_check_has_power():
    """The same check rejects the draft's own distribution (a lossy sampler would be caught)."""
    p = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.4, 0.3, 0.2, 0.1]])
    q = torch.tensor([[0.4, 0.1, 0.4, 0.1]])
    toks, res = _run_verify(p, q, 50_000, seed=3)
    first = torch.where(res.accepted >= 1, toks[:, 0], res.next_token).numpy()
    assert chi2_pvalue(first, q[0].numpy()) < 1e-12
    # "accept everything" (a classic bug) emits q, and is rejected against p
    assert chi2_pvalue(toks[:, 0].numpy(), p[0].numpy()) < 1e-12


def test_identical_distributions_always_accept():
    p = torch.tensor([[0.3, 0.7], [0.6, 0.4], [0.5, 0.5]])
    toks, res = _run_verify(p, p[:2], 10_000, seed=4)
    assert (res.accepted == 2).all()


def test_greedy_accepts_argmax_agreement():
    p = torch.tensor([[[0.1, 0.9, 0.0], [0.8, 0.1, 0.1], [0.2, 0.2, 0.6]]] * 2)
    q = torch.tensor([[[0.2, 0.8, 0.0], [0.1, 0.1, 0.8]]] * 2)
    toks = torch.tensor([[1, 2], [1, 0]])
    res = verify(p, q, toks, greedy=True)
    assert res.accepted.tolist() == [1, 2]
    assert res.next_token.tolist() == [0, 2]  # target argmax at the rejection / bonus position


def _reference_probs(logits: np.ndarray, temperature: float, top_p: float) -> np.ndarray:
    """An independent float64 reference: softmax(logits / T), then the smallest set of most likely
    tokens whose mass reaches top_p (the crossing token kept), renormalised."""
    z = logits.astype(np.float64) / temperature
    p = np.exp(z - z.max())
    p /= p.sum()
    order = np.argsort(-p, kind="stable")
    out = np.zeros_like(p)
    mass = 0.0
    for i in order:
        if mass >= top_p:
            break
        out[i] = p[i]
        mass += p[i]
    return out / out.sum()


def test_temperature_then_nucleus_against_a_float64_reference():
    # a case where the order matters: at T = 1 the nucleus of 0.6 keeps two tokens (0.5 + 0.3);
    # sharpened by T = 0.5 first (0.66, 0.24, 0.10) it keeps only the first
    logits = np.log(np.array([0.5, 0.3, 0.2]))
    want = _reference_probs(logits, 0.5, 0.6)
    np.testing.assert_allclose(want, [1.0, 0.0, 0.0])
    got = process_probs(torch.tensor(logits[None], dtype=torch.float32), 0.5, 0.6)[0].double().numpy()
    np.testing.assert_allclose(got, want, atol=1e-6)
    rng = np.random.default_rng(0)
    for _ in range(200):
        v = int(rng.integers(2, 40))
        logits = rng.normal(0, rng.uniform(0.1, 4), v)
        t, tp = float(rng.uniform(0.2, 2.0)), float(rng.uniform(0.05, 1.0))
        got = process_probs(torch.tensor(logits[None], dtype=torch.float32), t, tp)[0].double().numpy()
        np.testing.assert_allclose(got, _reference_probs(logits, t, tp), atol=2e-6)


@pytest.mark.parametrize("kept", [0, 1, 2])
def test_trimming_keeps_every_emitted_position_on_p(kept):
    """Live AV's trimmed step on hand-made p and q (K = 2): whatever is kept, token 1 ~ p0, token 2
    (emitted after an accepted first draft) ~ p1, and trimmed drafts are never emitted."""
    from svt.collect.sampling import trim

    p = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.4, 0.3, 0.2, 0.1], [0.25, 0.05, 0.6, 0.1]])
    q = torch.tensor([[0.4, 0.1, 0.4, 0.1], [0.1, 0.6, 0.1, 0.2]])
    n = 300_000
    toks, res = _run_verify(p, q, n, seed=10 + kept)
    g = torch.Generator().manual_seed(20 + kept)
    acc, nxt = trim(p.expand(n, 3, 4), res.accepted, res.next_token, torch.full((n,), kept), greedy=False,
                    generator=g)
    assert (acc <= kept).all() and (acc == torch.minimum(res.accepted, torch.tensor(kept))).all()
    first = torch.where(acc >= 1, toks[:, 0], nxt)
    assert chi2_pvalue(first.numpy(), p[0].numpy()) > ALPHA
    reached = acc >= 1
    if kept >= 1:
        second = torch.where(acc >= 2, toks[:, 1], nxt)[reached]
        assert chi2_pvalue(second.numpy(), p[1].numpy()) > ALPHA
        # power: mixing in 5 % of the residual at position 1 (what an off-by-one stop rule emits)
        # is 2 % TV away from p1, and the same check rejects it
        resid = (p[1] - q[1]).clamp_min(0)
        wrong = 0.95 * p[1] + 0.05 * resid / resid.sum()
        assert 0.5 * (wrong - p[1]).abs().sum().item() == pytest.approx(0.02)
        assert chi2_pvalue(second.numpy(), wrong.numpy()) < 1e-6
    else:
        assert not reached.any()


def test_the_inverse_cdf_sampler_draws_each_row_from_its_own_law():
    """``sample_tokens`` against the rows' laws: zeros inside and at both ends (never drawn), a row
    that is not normalised (its own mass, not 1), a peaked row, all in one batch."""
    rows = torch.tensor([[0.0, 0.2, 0.0, 0.5, 0.3, 0.0],
                         [2.0, 0.0, 1.0, 0.5, 0.0, 0.5],  # mass 4
                         [0.0, 0.0, 0.0, 1e-3, 0.999, 0.0]])
    n = 200_000
    x = sample_tokens(rows.repeat(n, 1), torch.Generator().manual_seed(11)).view(n, 3)
    assert x.dtype == torch.long and x.shape == (n, 3)
    for r in range(3):
        assert chi2_pvalue(x[:, r].numpy(), rows[r].numpy()) > ALPHA
    # it has power: the second row read as if it summed to 1 is rejected
    wrong = rows[1].clone()
    wrong[0] = 3.0
    assert chi2_pvalue(x[:, 1].numpy(), wrong.numpy()) < 1e-12


@pytest.mark.parametrize("u", [0.0, 1.0 - 2.0**-53])
def test_the_inverse_cdf_sampler_at_the_ends_of_u(monkeypatch, u):
    """u at its extremes (rand's 0 and its largest float below 1) still lands on a token of positive
    probability: the first interval is closed on the left, the mass is never reached."""
    real = torch.rand
    monkeypatch.setattr(torch, "rand", lambda *a, **k: torch.full_like(real(*a, **k), u))
    probs = torch.tensor([[0.0, 0.3, 0.7, 0.0], [0.0, 0.1 + 0.2, 0.0, 0.0], [0.5, 0.25, 0.125, 0.125]])
    got = sample_tokens(probs, None).tolist()
    assert got == ([1, 1, 0] if u == 0.0 else [2, 1, 3])


def test_the_inverse_cdf_keeps_a_token_of_one_in_a_billion(monkeypatch):
    """The cumulative mass is float64: a token of probability 1e-9 beside 0.5 keeps its interval
    (in float32, 0.5 + 1e-9 rounds to 0.5 and the token could never be drawn)."""
    real = torch.rand
    monkeypatch.setattr(torch, "rand", lambda *a, **k: torch.full_like(real(*a, **k), 0.5 + 4e-10))
    probs = torch.tensor([[0.5, 1e-9, 0.5]])
    assert sample_tokens(probs, None).tolist() == [1]


@pytest.mark.parametrize("bad", [[float("nan"), 0.5, 0.5], [0.0, 0.0, 0.0], [float("inf"), 1.0, 0.0]])
def test_a_row_without_a_finite_positive_mass_is_an_error_not_a_token(bad):
    """NaN, zero or infinite mass (a forward that overflowed): torch.multinomial raised; the inverse
    CDF would return index V, a token outside the vocabulary, so it raises too."""
    probs = torch.tensor([[0.2, 0.3, 0.5], bad])
    with pytest.raises(ValueError, match="finite positive mass"):
        sample_tokens(probs, torch.Generator().manual_seed(0))
