"""The induction gate measures what it says: a model that copies perfectly passes with a perfect
induction head where the copying happens; one that does not copy fails; the repeat windows of the
phase's data hold the spans they claim."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from svt.models.induction import induction_gate, passes, repeated_strings
from svt.models.induction_phase import PhaseConfig, window_batch

VOCAB, L = 50, 12


class Copier(torch.nn.Module):
    """Predicts, at each position of the second copy, the token after the current token's earlier
    twin, and attends there with head 1 of layer 1 (of 2 layers, 2 heads); uniform elsewhere."""

    def __init__(self, length: int, copy: bool = True):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.config = SimpleNamespace(_attn_implementation="sdpa")
        self.length, self.copy = length, copy

    def forward(self, input_ids, output_attentions=False):
        n, t = input_ids.shape
        logits = torch.zeros(n, t, VOCAB)
        att = [torch.full((n, 2, t, t), 1.0 / t) for _ in range(2)]
        for q in range(self.length + 1, t):
            k = q - self.length + 1  # the token after the earlier twin of the token at q
            if self.copy:
                logits[torch.arange(n), q, input_ids[:, k]] = 30.0
            att[1][:, 1, q, :] = 0.0
            att[1][:, 1, q, k] = 1.0
        assert self.config._attn_implementation == "eager" or not output_attentions
        return SimpleNamespace(logits=logits + self.w, attentions=tuple(att) if output_attentions else None)


def test_a_perfect_copier_passes_with_its_induction_head():
    g = induction_gate(Copier(L), vocab=VOCAB, bos=0, length=L, n=16)
    assert g["top1"] == 1.0 and g["cross_entropy"] < 1e-6 and passes(g)
    assert g["first_copy_cross_entropy"] == pytest.approx(np.log(VOCAB), abs=1e-5)  # flat logits there
    assert g["induction_score"][1][1] == 1.0 and g["max_induction_score"] == 1.0
    assert g["induction_score"][0][0] < 0.1  # a uniform head


def test_a_model_that_does_not_copy_fails():
    g = induction_gate(Copier(L, copy=False), vocab=VOCAB, bos=0, length=L, n=16, heads=False)
    assert g["cross_entropy"] == pytest.approx(np.log(VOCAB), abs=1e-5) and g["top1"] < 0.2 and not passes(g)
    assert "induction_score" not in g


def test_repeated_strings_are_written_twice():
    s = repeated_strings(5, L, VOCAB, seed=3, bos=0)
    assert s.shape == (5, 2 * L + 1) and (s[:, 0] == 0).all()
    assert torch.equal(s[:, 1:L + 1], s[:, L + 1:]) and (s[:, 1:] >= 1).all()


def test_phase_windows_repeat_a_span_in_the_shares_asked():
    stream = np.arange(10_000) % 997 + 100  # no span of it repeats within 200 tokens
    cfg = PhaseConfig(batch=400, context=64, random_share=0.3, copy_share=0.3)
    x = window_batch(stream, cfg, np.random.default_rng(0), VOCAB).numpy()

    def has_repeat(row, span=4):
        seen = set()
        for i in range(len(row) - span + 1):
            key = tuple(row[i:i + span])
            if key in seen:
                return True
            seen.add(key)
        return False

    share = np.mean([has_repeat(r) for r in x])
    assert 0.5 < share < 0.7  # 60 % asked (a span of 4 or more, written twice)


def test_phase_windows_keep_their_spans_under_max_span():
    stream = np.full(10_000, 1000)  # no stream token is a random token (those are < VOCAB)
    spans = {}
    for max_span in (8, None):
        cfg = PhaseConfig(batch=300, context=128, random_share=1.0, copy_share=0.0, max_span=max_span)
        x = window_batch(stream, cfg, np.random.default_rng(1), VOCAB).numpy()
        spans[max_span] = (x < VOCAB).sum(axis=1) / 2  # the span, written twice
    assert spans[8].min() >= 4 and spans[8].max() == 8
    assert spans[None].max() > 32  # up to half the window when unbounded
