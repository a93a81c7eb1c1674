"""The in-place growing KV cache against transformers' own ``DynamicLayer`` / ``DynamicCache``."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config
from transformers.cache_utils import DynamicCache, DynamicLayer

from svt.collect.kv_cache import GrowingLayer, growing_cache

# one op: ("update", slots) | ("select", seed) | ("crop", slots) | ("reset", 0)
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("update"), st.integers(1, 40)),
        st.tuples(st.just("select"), st.integers(0, 10**6)),
        st.tuples(st.just("crop"), st.integers(0, 30)),
        st.tuples(st.just("reset"), st.just(0)),
        st.tuples(st.just("reorder"), st.integers(0, 10**6)),
        st.tuples(st.just("repeat"), st.integers(1, 2)),
    ),
    min_size=1,
    max_size=25,
)


class _SmallRoom(GrowingLayer):
    initial_room = 3  # so a few updates make the buffer double several times


def _same(a: DynamicLayer, b: GrowingLayer) -> None:
    assert a.get_seq_length() == b.get_seq_length()
    if a.get_seq_length():
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


@settings(max_examples=60, deadline=None)
@given(ops=OPS, batch=st.integers(1, 4), seed=st.integers(0, 1000))
def test_layer_matches_dynamic_layer_op_for_op(ops, batch, seed):
    """Every update, row selection, crop and reset leaves the same keys and values as
    transformers' concatenating layer (small room, so the buffer doubles several times)."""
    gen = torch.Generator().manual_seed(seed)
    ref, grow = DynamicLayer(), _SmallRoom()
    rows = batch
    for op, arg in ops:
        if op == "update":
            k = torch.randn((rows, 2, arg, 3), generator=gen)
            v = torch.randn((rows, 2, arg, 3), generator=gen)
            out_ref, out_grow = ref.update(k, v), grow.update(k, v)
            assert torch.equal(out_ref[0], out_grow[0]) and torch.equal(out_ref[1], out_grow[1])
        elif op == "select" and ref.get_seq_length():
            keep = torch.randperm(rows, generator=torch.Generator().manual_seed(arg))[: max(1, rows - 1)]
            keep = keep.sort().values
            ref.batch_select_indices(keep)
            grow.batch_select_indices(keep)
            rows = keep.numel()
        elif op == "crop" and ref.get_seq_length():
            drop = min(arg, ref.get_seq_length())
            ref.crop(-drop)
            grow.crop(-drop)
        elif op == "reorder" and ref.get_seq_length():  # beam search: rows permuted, some repeated
            idx = torch.randint(0, rows, (rows,), generator=torch.Generator().manual_seed(arg))
            ref.reorder_cache(idx)
            grow.reorder_cache(idx)
        elif op == "repeat" and ref.get_seq_length() and rows * arg <= 8:
            ref.batch_repeat_interleave(arg)
            grow.batch_repeat_interleave(arg)
            rows *= arg
        elif op == "reset":
            ref.reset()
            grow.reset()
            rows = batch
        _same(ref, grow)


def _tiny_llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    return LlamaForCausalLM(cfg).eval()


@torch.inference_mode()
def test_model_logits_equal_dynamic_cache_through_steps_and_row_drops():
    """A model fed through a growing cache (prefill, appends of several widths past the first
    doubling, finished rows leaving, a crop) gives the same logits, bit for bit, as through
    transformers' DynamicCache."""
    model = _tiny_llama()
    gen = torch.Generator().manual_seed(1)
    caches = [DynamicCache(config=model.config), growing_cache(model.config)]
    assert all(type(layer) is GrowingLayer for layer in caches[1].layers)
    B, width = 3, 20
    mask = torch.ones((B, width), dtype=torch.long)
    ids = torch.randint(0, 64, (B, width), generator=gen)
    feeds = [(ids, mask)]
    for _ in range(40):  # 40 steps of 6 slots: past the initial room, so the buffer grows
        feeds.append((torch.randint(0, 64, (B, 6), generator=gen), torch.ones((B, 6), dtype=torch.long)))
    full_mask = None
    rows = torch.arange(B)
    for i, (x, m) in enumerate(feeds):
        if i == 25:  # the middle row finishes
            rows = torch.tensor([0, 2])
            for c in caches:
                c.batch_select_indices(rows)
            full_mask = full_mask.index_select(0, rows)
        x, m = x.index_select(0, rows), m.index_select(0, rows)
        full_mask = m if full_mask is None else torch.cat([full_mask, m], 1)
        pos = (full_mask.cumsum(1) - 1)[:, -x.shape[1]:]
        outs = [model(input_ids=x, attention_mask=full_mask, position_ids=pos, cache=c, use_cache=True).logits
                for c in caches]
        assert torch.equal(outs[0], outs[1]), f"feed {i}"
    for c in caches:
        c.crop(-6)
    assert caches[0].get_seq_length() == caches[1].get_seq_length() == width + 39 * 6


def test_sliding_window_layers_keep_transformers_class():
    cfg = Qwen2Config(num_hidden_layers=3, use_sliding_window=True, sliding_window=4, max_window_layers=1,
                      hidden_size=32, num_attention_heads=2, num_key_value_heads=1, intermediate_size=64,
                      vocab_size=100)
    kinds = [type(layer).__name__ for layer in growing_cache(cfg).layers]
    assert kinds == ["GrowingLayer", "DynamicSlidingWindowLayer", "DynamicSlidingWindowLayer"]


def test_buffer_doubles_so_appends_copy_linearly():
    """One slot at a time, 2,000 times: the buffer is reallocated O(log n) times, not per append."""
    layer = _SmallRoom()
    allocations = 0
    last = None
    for _ in range(2000):
        layer.update(torch.zeros((1, 1, 1, 2)), torch.zeros((1, 1, 1, 2)))
        if layer._kbuf is not last:
            allocations += 1
            last = layer._kbuf
    assert layer.get_seq_length() == 2000
    assert allocations <= 11, allocations  # 4, 8, ..., 2**11 slots


def test_importing_registers_nothing_in_transformers():
    import transformers.cache_utils as cu

    assert cu.DYNAMIC_LAYER_TYPE_MAPPING["full_attention"] is DynamicLayer
    assert GrowingLayer not in cu.DYNAMIC_LAYER_TYPE_MAPPING.values()
    assert all(type(layer) is DynamicLayer for layer in DynamicCache(config=_tiny_llama().config).layers)


def test_offload_and_prefetch_keep_the_views_on_the_buffers():
    layer = GrowingLayer()
    k = torch.randn((1, 2, 5, 3))
    layer.update(k, k)
    layer.offload()
    layer.prefetch()
    layer.update(k, k)
    assert torch.equal(layer.keys, torch.cat([k, k], -2)) and layer.keys.data_ptr() == layer._kbuf.data_ptr()


def test_the_cache_goes_by_the_keyword_the_models_forward_takes():
    """transformers 5.19 (vLLM 0.32's) names it ``past_key_values`` and passes an unknown ``cache=``
    on to ``**kwargs``: every forward then silently ran without the cache, and svt's engine emitted
    wrong tokens in that environment. The engine's cache uses whichever keyword the forward names."""
    import torch

    from svt.collect.engine import _Cache
    from svt.collect.kv_cache import cache_kwarg

    class Old(torch.nn.Module):
        config = None

        def forward(self, input_ids, attention_mask=None, position_ids=None, past_key_values=None, use_cache=None,
                    **kwargs):
            self.seen = (past_key_values, kwargs)
            return "out"

    class New(Old):
        def forward(self, input_ids, attention_mask=None, position_ids=None, cache=None, use_cache=None, **kwargs):
            self.seen = (cache, kwargs)
            return "out"

    from transformers import LlamaConfig

    for cls, key in ((Old, "past_key_values"), (New, "cache")):
        m = cls()
        m.config = LlamaConfig(num_hidden_layers=1, hidden_size=8, num_attention_heads=2)
        assert cache_kwarg(m) == key
        c = _Cache(m, 1, torch.device("cpu"))
        c.forward(torch.zeros((1, 2), dtype=torch.long), torch.ones((1, 2), dtype=torch.long))
        assert m.seen[0] is c.cache and "cache" not in m.seen[1] and "past_key_values" not in m.seen[1]


def _layer_with(rows: int, slots: int, seed: int) -> GrowingLayer:
    g = torch.Generator().manual_seed(seed)
    layer = GrowingLayer()
    if slots:
        for n in (slots // 2, slots - slots // 2):  # two updates, so the buffer has spare room past its slots
            if n:
                layer.update(torch.randn((rows, 2, n, 4), generator=g), torch.randn((rows, 2, n, 4), generator=g))
    return layer


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 5), slots=st.integers(0, 9), new_rows=st.integers(1, 3), new_slots=st.integers(1, 12),
       seed=st.integers(0, 1000), data=st.data())
def test_merge_of_the_rows_kept_equals_a_select_then_a_merge(rows, slots, new_rows, new_slots, seed, data):
    """Continuous batching drops finished rows in the same copy that admits the new ones: the result
    is, slot for slot, a ``batch_select_indices`` of the rows kept followed by the merge (left
    padding on the narrower side, zeros in it), whatever the widths and rows kept."""
    keep = torch.tensor(sorted(data.draw(st.sets(st.integers(0, rows - 1), max_size=rows))), dtype=torch.long)
    width = max(slots, new_slots)
    pads = (width - slots, width - new_slots)
    a, b = _layer_with(rows, slots, seed), _layer_with(rows, slots, seed)
    other = _layer_with(new_rows, new_slots, seed + 1)
    if slots:
        a.batch_select_indices(keep)
    a.merge(other, pads, (keep.numel(), new_rows))
    b.merge(other, pads, (keep.numel(), new_rows), keep)
    assert a.get_seq_length() == b.get_seq_length() == width
    assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
    assert b.keys.shape[0] == keep.numel() + new_rows
    assert not b.keys[: keep.numel(), :, : pads[0]].any() and not b.keys[keep.numel():, :, : pads[1]].any()
    b.update(torch.ones((keep.numel() + new_rows, 2, 1, 4)), torch.ones((keep.numel() + new_rows, 2, 1, 4)))
    assert b.get_seq_length() == width + 1  # room to grow: the merged buffer takes the next step's slots
