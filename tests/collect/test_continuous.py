"""Continuous batching and plain decoding in svt's engine: a finished row's slot takes the next
prompt at the next step (its caches joined to the batch's), greedy output equal to the target's
greedy decoding, every logged draft equal to a fresh unbatched forward, lossless sampling (exact
enumeration), and the schedule the engine logs (B rows decode while requests wait)."""

import numpy as np
import pytest
import torch

from svt.collect.engine import SamplingParams, run_batch
from tests.collect.test_engine import (
    PROMPTS,
    _ids,
    _plain_greedy,
    assert_logged_features_match_fresh_forwards,
)
from tests.collect.test_engine_lossless import PROMPT, N, V, _chi2, _exact_joint, _shifted
from tests.collect.test_engine_lossless import pair as pair  # noqa: F401  (the module fixture)

MORE = PROMPTS + ["x = [1, 2, 3]\nfor i in x:\n", "while True:\n    line = f.readline()\n"]


def _cat(table):
    return {k: np.concatenate(v) for k, v in table.items()}


@pytest.mark.parametrize("k", [0, 3])
def test_continuous_greedy_equals_target_greedy_and_keeps_the_slots_full(tiny_pair, k):
    """Six prompts of different lengths through 2 slots: every row is the target's greedy decoding
    (K = 0 is plain decoding through the engine), and 2 rows decode at every step while prompts wait."""
    tok = tiny_pair.tokenizer
    prompts = _ids(tok, MORE)
    log = run_batch(tiny_pair.target, tiny_pair.draft, prompts, SamplingParams(0.0, 1.0, k, 40), eos_id=None,
                    pad_id=tok.pad_token_id, generator=torch.Generator().manual_seed(0), slots=2)
    full = [_plain_greedy(tiny_pair.target, p, 40) for p in prompts]
    assert log.outputs == full
    sched = _cat(log.schedule)
    steps = _cat(log.steps)
    waiting = np.cumsum(sched["admitted"]) < len(prompts)
    assert waiting.sum() > 5 and (sched["batch_size"][waiting] == 2).all()
    assert sched["admitted"].sum() == len(prompts) and sched["admitted"][0] == 2
    assert (np.diff(sched["tick"]) == 1).all()
    # each request's steps are consecutive ticks, and a step's rows are the tick's batch
    for r in range(len(prompts)):
        t = np.sort(steps["step"][steps["request"] == r])
        assert (np.diff(t) == 1).all()
    assert sched["emitted"].sum() == sum(len(o) for o in full)
    assert (sched["verify_tokens"] == sched["batch_size"] * (k + 1)).all()
    if k == 0:
        assert not log.drafts and (steps["accepted"] == 0).all() and (steps["emitted"] == 1).all()


def test_continuous_rows_leaving_at_different_steps_admit_as_many(tiny_pair):
    """Rows cut by eos at different steps: the slots they free are refilled at the next step, and
    the batch only drains once no prompt waits."""
    tok = tiny_pair.tokenizer
    prompts = _ids(tok, MORE)
    full = [_plain_greedy(tiny_pair.target, p, 30) for p in prompts]
    eos = full[0][7]  # a token the first row emits early; the others stop wherever they emit it
    log = run_batch(tiny_pair.target, tiny_pair.draft, prompts, SamplingParams(0.0, 1.0, 3, 30), eos_id=eos,
                    pad_id=tok.pad_token_id, generator=torch.Generator().manual_seed(0), slots=3)
    for got, ref in zip(log.outputs, full, strict=True):
        assert got == (ref[: ref.index(eos) + 1] if eos in ref else ref)
    sched = _cat(log.schedule)
    admitted_by = np.cumsum(sched["admitted"])
    waiting = admitted_by < len(prompts)
    assert (sched["batch_size"][waiting] == 3).all()
    assert sched["batch_size"][~waiting].min() >= 1


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.7, 0.9)])
def test_continuous_logged_features_match_fresh_forwards(tiny_pair, temperature, top_p):
    """p_sampled, q_sampled and q_max of every labelled draft equal an unbatched forward on its prefix
    when rows join a running batch: the joined caches (padding, positions, holes) are exact."""
    g = torch.Generator().manual_seed(1)
    checked = assert_logged_features_match_fresh_forwards(tiny_pair.target, tiny_pair.draft, tiny_pair.tokenizer,
                                                          temperature, top_p, g, slots=2)
    assert checked > 40


def _collect(pair, temperature, top_p, k, seed, slots):
    target, draft = pair
    outs = []
    for i in range(N // 20_000):
        g = torch.Generator().manual_seed(seed + i)
        # prompts of two lengths, so joined rows are padded; max_new_tokens 2 keeps every row's first two
        log = run_batch(target, draft, [PROMPT] * 20_000, SamplingParams(temperature, top_p, k, 2), eos_id=None,
                        pad_id=0, generator=g, slots=slots)
        outs.append(np.array(log.outputs))
        assert _cat(log.schedule)["admitted"].size > 1
    out = np.concatenate(outs)
    counts = np.zeros((V, V))
    np.add.at(counts, (out[:, 0], out[:, 1]), 1)
    return counts


@pytest.mark.parametrize("k", [0, 2])
def test_continuous_emitted_pairs_follow_the_target_exactly(pair, k):  # noqa: F811
    """The first two tokens of 40,000 rows decoded 6,000 at a time, rows joining after every step:
    chi-square against the exact joint (enumerated), with the power to reject 1.5 % TV."""
    joint = _exact_joint(pair[0], 1.0, 1.0)
    counts = _collect(pair, 1.0, 1.0, k, 300, slots=6_000)
    assert _chi2(counts, joint) > 1e-4
    fake = np.random.default_rng(1).multinomial(N, _shifted(joint, 0.015).ravel())
    assert _chi2(fake, joint) < 1e-4


@pytest.mark.parametrize("k", [0, 3])
def test_rows_finished_while_prompts_wait_leave_in_the_admissions_copy(tiny_pair, monkeypatch, k):
    """A row that finishes while prompts wait is not dropped at the end of its step (a copy of every
    layer's whole cache, once per finishing request, inside the decode steps): it leaves in the
    merge that admits the next prompt into its slot. Only once no prompt waits do rows leave on
    their own; the outputs stay the target's greedy decoding (rows cut by eos at different steps)."""
    from svt.collect import engine

    events = []
    real_drop, real_merge, real_prefill = engine._Rows.drop, engine._Rows.merge, engine.prefill_rows

    def drop(self, done, device):
        events.append(("drop", int(done.sum())))
        return real_drop(self, done, device)

    def merge(self, new):
        events.append(("merge", 0 if self.gone is None else int(self.gone.sum())))
        return real_merge(self, new)

    def prefill(*args, **kwargs):
        events.append(("admit", len(args[2])))
        return real_prefill(*args, **kwargs)

    monkeypatch.setattr(engine._Rows, "drop", drop)
    monkeypatch.setattr(engine._Rows, "merge", merge)
    monkeypatch.setattr(engine, "prefill_rows", prefill)
    tok = tiny_pair.tokenizer
    prompts = _ids(tok, MORE)
    full = [_plain_greedy(tiny_pair.target, p, 30) for p in prompts]
    eos = full[0][7]
    log = run_batch(tiny_pair.target, tiny_pair.draft, prompts, SamplingParams(0.0, 1.0, k, 30), eos_id=eos,
                    pad_id=tok.pad_token_id, generator=torch.Generator().manual_seed(0), slots=3)
    for got, ref in zip(log.outputs, full, strict=True):
        assert got == (ref[: ref.index(eos) + 1] if eos in ref else ref)
    last_admit = max(i for i, e in enumerate(events) if e[0] == "admit")
    assert not [e for e in events[:last_admit] if e[0] == "drop"], events
    assert sum(n for e, n in events if e == "admit") == len(prompts)
    assert sum(n for e, n in events if e == "merge") > 0, events  # finished rows left in an admission's merge
    sched = _cat(log.schedule)
    waiting = np.cumsum(sched["admitted"]) < len(prompts)
    assert (sched["batch_size"][waiting] == 3).all()
