"""The lean Llama forward against transformers' own: the same logits and hidden states on every real
position (float32, to 1e-6; bit for bit on this CPU), through caches with holes, left padding,
grouped key/value heads, and the engine's compaction and rows leaving; a whole batch collected
either way gives the same tokens, labels and logged probabilities. Configurations whose forward
differs are left to transformers, with the reason."""

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from svt.collect.engine import SamplingParams, _Cache, run_batch
from svt.models.lean import LeanLlama, additive_mask, forward_name, lean_forward, why_not_lean


def _gqa_model(dtype=torch.float32, **over):
    cfg = LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=256, attn_implementation="sdpa", **over)
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).eval().to(dtype)


def _steps(model, rng, batch=3, steps=6):
    """The same sequence of forwards (holes, a compaction, a row leaving) through both paths; the
    largest difference on real positions, logits and hidden states."""
    vocab = model.config.vocab_size
    worst = 0.0
    caches = [_Cache(model, batch, torch.device("cpu")), _Cache(model, batch, torch.device("cpu"))]
    caches[1].run = model  # transformers' own
    assert isinstance(caches[0].run, LeanLlama)
    width = 9
    ids = torch.from_numpy(rng.integers(3, vocab, (batch, width)))
    mask = torch.ones((batch, width), dtype=torch.long)
    mask[0, :4] = 0  # left padding
    for step in range(steps):
        outs = [c.forward(ids, mask, hidden=True) for c in caches]
        real = mask.bool()
        worst = max(worst, float((outs[0].logits - outs[1].logits)[real].abs().max()))
        assert len(outs[0].hidden_states) == len(outs[1].hidden_states) == model.config.num_hidden_layers + 1
        for a, b in zip(outs[0].hidden_states, outs[1].hidden_states, strict=True):
            worst = max(worst, float((a - b)[real].abs().max()))
        assert torch.isfinite(outs[0].logits).all()
        n = ids.shape[0]
        keep = torch.from_numpy(rng.integers(0, 2, (n, 4))).long()
        keep[:, 0], keep[:, 1] = 1, 0  # a slot every row masks: what compaction drops
        for c in caches:
            c.restrict_last(keep) if ids.shape[1] >= 4 else None
        if step == 2:  # a row leaves
            rows = torch.tensor([0, 2][: n - 1])
            for c in caches:
                c.select(rows)
        if step == 4:
            import svt.collect.engine as engine

            old = engine.COMPACT_MIN_HOLES, engine.COMPACT_SHARE
            engine.COMPACT_MIN_HOLES, engine.COMPACT_SHARE = 1, 0.0
            try:
                assert all(c.compact() for c in caches)
            finally:
                engine.COMPACT_MIN_HOLES, engine.COMPACT_SHARE = old
        n = caches[0].mask.shape[0]
        t = int(rng.integers(1, 5))
        ids = torch.from_numpy(rng.integers(3, vocab, (n, t)))
        mask = torch.ones((n, t), dtype=torch.long)
        mask[0, 0] = int(rng.integers(0, 2))  # a hole fed with the new tokens
    return worst


@torch.inference_mode()
@pytest.mark.parametrize("which", ["target", "draft"])
def test_the_built_in_models_give_transformers_numbers(tiny_pair, which):
    assert _steps(getattr(tiny_pair, which), np.random.default_rng(0)) <= 1e-6


@torch.inference_mode()
def test_grouped_key_value_heads_give_transformers_numbers():
    assert _steps(_gqa_model(), np.random.default_rng(1)) <= 1e-6


@torch.inference_mode()
def test_bf16_follows_transformers_within_its_rounding():
    assert _steps(_gqa_model(torch.bfloat16), np.random.default_rng(2)) <= 0.05


@pytest.mark.parametrize("over, words", [
    ({"attention_bias": True}, "attention_bias"),
    ({"mlp_bias": True}, "mlp_bias"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"pretraining_tp": 2}, "pretraining_tp"),
    ({"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}}, "rope_type"),
])
def test_a_forward_that_differs_is_left_to_transformers(over, words):
    model = _gqa_model(**over)
    assert words in why_not_lean(model) and lean_forward(model) is None
    assert forward_name(model) == "transformers"


def test_eager_attention_and_the_switch_are_left_to_transformers(monkeypatch):
    model = _gqa_model()
    assert why_not_lean(model) is None and forward_name(model) == "svt lean llama"
    model.config._attn_implementation = "eager"
    assert "attention" in why_not_lean(model)
    model.config._attn_implementation = "sdpa"
    monkeypatch.setenv("SVT_FORWARD", "transformers")
    assert "SVT_FORWARD" in why_not_lean(model) and _Cache(model, 1, torch.device("cpu")).run is model


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_batch_collected_either_way_is_the_same(tiny_pair, monkeypatch, temperature):
    """Tokens and labels identical, logged probabilities within 1e-6 (the issue's bar for a cheaper
    forward: the sampling stays lossless because the distributions are the same)."""
    tok = tiny_pair.tokenizer
    prompts = [tok.encode(t, add_special_tokens=False) for t in ("def f(x):\n    return", "import os\nimport",
                                                                  "class A:\n    def __init__(self):\n")]

    def collect():
        return run_batch(tiny_pair.target, tiny_pair.draft, prompts, SamplingParams(temperature, 1.0, 4, 24),
                         eos_id=None, pad_id=tok.pad_token_id, generator=torch.Generator().manual_seed(5))

    lean = collect()
    monkeypatch.setenv("SVT_FORWARD", "transformers")
    ref = collect()
    assert lean.outputs == ref.outputs
    for col in ("label", "token"):
        assert np.array_equal(np.concatenate(lean.drafts[col]), np.concatenate(ref.drafts[col]))
    for col in ("q_max", "q_sampled", "p_sampled", "q_entropy", "accept_prob_expected"):
        a, b = np.concatenate(lean.drafts[col]), np.concatenate(ref.drafts[col])
        assert np.allclose(a, b, atol=1e-6, equal_nan=True), col


def test_the_mask_is_causal_over_slots_and_never_leaves_a_query_nothing():
    """Three rows, 5 slots, the last 2 new: row 0 has a hole at slot 1; row 1's new slots are holes
    (the engine feeds such rows); row 2 has nothing live at all (the prefill of a one-token prompt,
    all padding). Every query sees the live slots up to its own, and its own slot: row 2's queries
    see that alone, so no attention kernel meets an empty row."""
    m = torch.tensor([[1, 0, 1, 1, 1], [1, 1, 1, 0, 0], [0, 0, 0, 0, 0]])
    got = (additive_mask(m, 2, torch.float32)[:, 0] == 0).int().tolist()
    assert got == [[[1, 0, 1, 1, 0], [1, 0, 1, 1, 1]],
                   [[1, 1, 1, 1, 0], [1, 1, 1, 0, 1]],
                   [[0, 0, 0, 1, 0], [0, 0, 0, 0, 1]]]


def test_an_argument_it_does_not_take_is_refused_not_ignored(tiny_pair):
    from svt.collect.kv_cache import growing_cache

    lean = lean_forward(tiny_pair.draft)
    with pytest.raises(TypeError, match="logits_to_keep"):
        lean(input_ids=torch.tensor([[5, 6]]), cache=growing_cache(tiny_pair.draft.config), logits_to_keep=1)


def test_a_callers_4d_mask_gives_transformers_numbers(tiny_pair):
    """A draft tree's forward passes its own additive mask ``[1, 1, T, S]`` (each node sees the
    prompt and its ancestors, not its siblings): the lean forward uses it as transformers does,
    logits and hidden states equal to 1e-6 in float32 (svt.collect.tree_decode runs its trees so)."""
    from svt.collect.kv_cache import cache_kwarg, growing_cache

    model = tiny_pair.target
    rng = np.random.default_rng(0)
    prompt = torch.from_numpy(rng.integers(3, model.config.vocab_size, (1, 12)))
    tree = torch.from_numpy(rng.integers(3, model.config.vocab_size, (1, 4)))
    # nodes 0, 1 children of the last prompt token; 2 child of 0; 3 child of 1
    parents = [-1, -1, 0, 1]
    allow = np.zeros((4, 16), dtype=bool)
    allow[:, :12] = True
    for i, par in enumerate(parents):
        allow[i, 12 + i] = True
        while par >= 0:
            allow[i, 12 + par] = True
            par = parents[par]
    mask = torch.full(allow.shape, torch.finfo(torch.float32).min)
    mask[torch.from_numpy(allow)] = 0.0
    pos = torch.tensor([[12, 12, 13, 13]])
    outs = []
    for run in (lean_forward(model), model):
        cache = growing_cache(model.config)
        run(input_ids=prompt, use_cache=True, **{cache_kwarg(model): cache})
        outs.append(run(input_ids=tree, attention_mask=mask[None, None], position_ids=pos, use_cache=True,
                        output_hidden_states=True, **{cache_kwarg(model): cache}))
    assert isinstance(lean_forward(model), LeanLlama)
    assert torch.allclose(outs[0].logits, outs[1].logits, atol=1e-6, rtol=0)
    for a, b in zip(outs[0].hidden_states, outs[1].hidden_states, strict=True):
        assert torch.allclose(a, b, atol=1e-6, rtol=0)
    # and the mask matters: node 3 (a grandchild through node 1) differs from a causal forward's
    cache = growing_cache(model.config)
    lean_forward(model)(input_ids=prompt, use_cache=True, cache=cache)
    causal = lean_forward(model)(input_ids=tree, position_ids=pos, use_cache=True, cache=cache)
    assert not torch.allclose(causal.logits[0, 3], outs[0].logits[0, 3], atol=1e-3)
