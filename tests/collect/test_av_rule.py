"""The AV budget rule and losslessness: the document's (engine) rule is lossy on a non-convex cost
curve, the convex-minorant rule is not (the worked case through the real engine, with two
hand-made bigram models), and the convex rule never looks at a request's later confidences."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats
from torch import nn

from svt.collect.engine import LiveAV, SamplingParams, run_batch
from svt.simulate.av import av_keep, convex_minorant
from svt.simulate.costs import CostTable


class Bigram(nn.Module):
    """A causal LM whose next-token distribution depends only on the current token (a V x V table),
    with the interface the engine uses (the KV cache is accepted and unused)."""

    def __init__(self, probs: np.ndarray):
        from transformers import LlamaConfig

        super().__init__()
        self.logp = nn.Parameter(torch.log(torch.as_tensor(probs, dtype=torch.float32)), requires_grad=False)
        self.config = LlamaConfig(vocab_size=probs.shape[0], hidden_size=8, num_hidden_layers=1,
                                  num_attention_heads=1, num_key_value_heads=1, head_dim=8, intermediate_size=8)

    def forward(self, input_ids, attention_mask=None, position_ids=None, cache=None, use_cache=True,
                output_hidden_states=False):
        return SimpleNamespace(logits=self.logp[input_ids], hidden_states=None)


def _worked_pair():
    """Tokens a = 0, b = 1, prompt = 2, pad = 3. After the prompt p0 = [.5, .5], q0 = [.2, .8];
    the draft's next confidence is 0.99 after a and 0.5 after b."""
    eps = 1e-9
    P = np.full((4, 4), eps)
    Q = np.full((4, 4), eps)
    P[2, :2], Q[2, :2] = [0.5, 0.5], [0.2, 0.8]
    P[0, :2], Q[0, :2] = [0.5, 0.5], [0.99, 0.01]
    P[1, :2], Q[1, :2] = [0.5, 0.5], [0.5, 0.5]
    P[3], Q[3] = 0.25, 0.25
    return Bigram(P / P.sum(1, keepdims=True)), Bigram(Q / Q.sum(1, keepdims=True))


# draft cost 0; verify 1, 2, 2.4 ms for 1, 2, 3 tokens: increments shrink (not convex)
COSTS = CostTable("measured", draft_ms={1: {1: 1e-9, 2: 1e-9}}, verify_ms={1: 1.0, 2: 2.0, 3: 2.4})


def test_the_worked_case_by_hand():
    # after x0 = a: survivals [.2, .198]; after b: [.8, .4] (the rule sees q_max: .2 or .8 then the next)
    assert av_keep(np.array([[0.8, 0.99]]), COSTS, "engine").tolist() == [2]
    assert av_keep(np.array([[0.8, 0.5]]), COSTS, "engine").tolist() == [0]
    # on the convex minorant (1, 1.7, 2.4) the decision on the first draft is the same either way
    assert convex_minorant(np.array([1.0, 2.0, 2.4])).tolist() == pytest.approx([1.0, 1.7, 2.4])
    a, b = av_keep(np.array([[0.8, 0.99]]), COSTS), av_keep(np.array([[0.8, 0.5]]), COSTS)
    assert (a > 0) == (b > 0)


def test_engine_rule_is_lossy_and_the_convex_rule_is_not_through_run_batch():
    target, draft = _worked_pair()
    n = 1500  # batch of one request each (the budget is decided per batch)
    first = {}
    for rule in ("engine", "convex"):
        av = LiveAV(confidence=lambda f, pos: f["q_max"], costs=COSTS, rule=rule)
        g = torch.Generator().manual_seed(5)
        first[rule] = np.array([run_batch(target, draft, [[2]], SamplingParams(1.0, 1.0, 2, 1), eos_id=None,
                                          pad_id=3, generator=g, av=av).outputs[0][0] for _ in range(n)])
    counts = {r: np.bincount(v, minlength=2)[:2] for r, v in first.items()}
    # the engine rule emits a with probability 0.6 (TV 0.1): rejected; the convex rule follows p
    assert stats.chisquare(counts["engine"], [n / 2, n / 2]).pvalue < 1e-6
    assert stats.chisquare(counts["engine"], [0.6 * n, 0.4 * n]).pvalue > 1e-4
    assert stats.chisquare(counts["convex"], [n / 2, n / 2]).pvalue > 1e-4


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 4), k=st.integers(1, 4), seed=st.integers(0, 10_000), data=st.data())
def test_convex_rule_decisions_never_depend_on_later_confidences(n, k, seed, data):
    rng = np.random.default_rng(seed)
    conf = rng.uniform(0.01, 0.99, (n, k))
    # a random non-decreasing, possibly very non-convex verify curve
    steps = np.cumsum(rng.choice([0.0, 0.0, 0.3, 1.0, 3.0], size=n * (k + 1) + 1)) + 1.0
    costs = CostTable("measured", draft_ms={n: {j: float(rng.uniform(0, 2)) * j for j in range(1, k + 1)}},
                      verify_ms={t: float(steps[t]) for t in range(1, steps.size)})
    base = av_keep(conf, costs, "convex")
    r = data.draw(st.integers(0, n - 1))
    i = data.draw(st.integers(0, k - 1))
    alt = conf.copy()
    alt[r, i + 1:] = rng.uniform(0.01, 0.99, k - i - 1)
    got = av_keep(alt, costs, "convex")
    # draft i of request r is verified or not whatever its later confidences are
    assert (got[r] > i) == (base[r] > i)
