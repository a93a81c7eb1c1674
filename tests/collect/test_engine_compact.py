"""Compacting the engine's KV caches (dropping the slots of rejected drafts and padding) leaves
every distribution the models compute as it was: against plain greedy decoding and fresh forwards,
with a compaction after every step."""

import numpy as np
import pytest
import torch

import svt.collect.engine as engine
from svt.collect.engine import SamplingParams, _Cache, run_batch
from svt.collect.kv_cache import GrowingLayer

from .test_engine import PROMPTS, _ids, _plain_greedy, assert_logged_features_match_fresh_forwards


@pytest.fixture
def compact_every_step(monkeypatch):
    """Compaction whenever any slot is a hole; counts the compactions that happened."""
    monkeypatch.setattr(engine, "COMPACT_MIN_HOLES", 1)
    monkeypatch.setattr(engine, "COMPACT_SHARE", 0.0)
    done = {"n": 0}
    original = _Cache.compact

    def counted(self):
        did = original(self)
        done["n"] += did
        return did

    monkeypatch.setattr(_Cache, "compact", counted)
    return done


def test_layer_compact_gathers_each_rows_slots_in_order():
    layer = GrowingLayer()
    gen = torch.Generator().manual_seed(0)
    k, v = torch.randn(3, 2, 9, 4, generator=gen), torch.randn(3, 2, 9, 4, generator=gen)
    layer.update(k[:, :, :5], v[:, :, :5])
    layer.update(k[:, :, 5:], v[:, :, 5:])
    index = torch.tensor([[0, 2, 7, 8], [1, 3, 4, 5], [6, 6, 6, 8]])
    layer.compact(index)
    assert layer.get_seq_length() == 4
    for b in range(3):
        assert torch.equal(layer.keys[b], k[b][:, index[b]])
        assert torch.equal(layer.values[b], v[b][:, index[b]])
    layer.update(k[:, :, :2], v[:, :, :2])  # appends after the kept slots
    assert torch.equal(layer.keys[:, :, 4:], k[:, :, :2])


def test_cache_compact_keeps_live_slots_right_aligned(tiny_pair, compact_every_step):
    """Rows with different live counts: after compaction each row's live slots are the last ones,
    in their order, and the mask says so."""
    model = tiny_pair.target
    c = _Cache(model, 2, torch.device("cpu"))
    with torch.inference_mode():
        c.forward(torch.tensor([[5, 6, 7, 8], [0, 0, 9, 10]]), torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]]))
        c.forward(torch.tensor([[11, 12], [13, 14]]), torch.ones((2, 2), dtype=torch.long))
        c.restrict_last(torch.tensor([[1, 0], [1, 1]]))
        before = c.cache.layers[0].keys.clone()
        mask = c.mask.clone()
        assert c.compact()
    assert c.mask.tolist() == [[1, 1, 1, 1, 1], [0, 1, 1, 1, 1]]
    assert c.live.tolist() == [5, 4]
    after = c.cache.layers[0].keys
    for b in range(2):
        live = before[b][:, mask[b].bool()]
        assert torch.equal(after[b][:, -live.shape[1]:], live)


def test_greedy_with_compaction_every_step_equals_plain_greedy(tiny_pair, compact_every_step):
    tok = tiny_pair.tokenizer
    prompts = _ids(tok, PROMPTS)
    g = torch.Generator().manual_seed(0)
    log = run_batch(tiny_pair.target, tiny_pair.draft, prompts, SamplingParams(0.0, 1.0, 4, 40),
                    eos_id=None, pad_id=tok.pad_token_id, generator=g)
    assert compact_every_step["n"] > 10
    for ids, got in zip(prompts, log.outputs, strict=True):
        assert got == _plain_greedy(tiny_pair.target, ids, 40)


def test_features_with_compaction_every_step_match_fresh_forwards(tiny_pair, compact_every_step):
    g = torch.Generator().manual_seed(1)
    checked = assert_logged_features_match_fresh_forwards(tiny_pair.target, tiny_pair.draft, tiny_pair.tokenizer,
                                                          1.0, 1.0, g)
    assert compact_every_step["n"] > 10 and checked > 40


def test_default_policy_compacts_a_long_low_acceptance_batch(tiny_pair):
    """With the shipped thresholds a batch that rejects most drafts does compact, and its greedy
    output is unchanged (the weak draft: most of each step's K + 1 slots are holes)."""
    tok = tiny_pair.tokenizer
    prompts = _ids(tok, PROMPTS[:2])
    calls = []
    original = _Cache.compact

    def counted(self):
        calls.append(original(self))
        return calls[-1]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_Cache, "compact", counted)
        log = run_batch(tiny_pair.target, tiny_pair.draft, prompts, SamplingParams(0.0, 1.0, 5, 80),
                        eos_id=None, pad_id=tok.pad_token_id, generator=torch.Generator().manual_seed(0))
    assert any(calls) and not all(calls)
    for ids, got in zip(prompts, log.outputs, strict=True):
        assert got == _plain_greedy(tiny_pair.target, ids, 80)
    assert np.mean(calls) < 0.5


def test_finished_rows_leave_before_the_caches_compact(tiny_pair, compact_every_step):
    """The row with the most live slots finishes: the compacted width is the longest row left."""
    from svt.collect.engine import prefill_rows

    tok = tiny_pair.tokenizer
    long, short = tok.encode("import os\nimport sys\nimport json\n" * 4), tok.encode("x = 1\n")
    dev = torch.device("cpu")
    with torch.inference_mode():
        rows = prefill_rows(tiny_pair.target, tiny_pair.draft, [long, short, short], tok.pad_token_id, dev)
        rows.end_step(np.array([True, False, False]), dev, compact=True)
    assert compact_every_step["n"] == 2  # both caches compacted, after the drop
    for cache in (rows.tc, rows.dc):
        assert cache.mask.shape == (2, len(short) - 1) and bool(cache.mask.all())
        assert cache.cache.layers[0].get_seq_length() == len(short) - 1
