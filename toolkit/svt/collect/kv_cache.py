"""A key/value cache that grows in place.

transformers' ``DynamicLayer`` appends each forward's keys and values with ``torch.cat``, so every
step copies the whole cache of every layer: on the demo's shapes (prompts up to 384 tokens, 128 new
tokens, K + 1 slots a step) that copy was 17 % of the collection's time on 2 CPU cores. A
``GrowingLayer`` keeps one buffer per layer with spare room, writes the new slots into it and hands
the attention a view of the filled part; when the room runs out it doubles the buffer (one copy, so
appending stays linear in the slots written). The values the model sees are the same tensors, slot
for slot, as with ``torch.cat``.

``growing_cache(config)`` is a ``DynamicCache`` whose full-attention layers are ``GrowingLayer``s
(sliding-window layers keep transformers' own class, which also trims). Every operation of
transformers' layer that replaces ``keys``/``values`` is overridden to act on the buffers:
``update``, ``batch_select_indices``, ``batch_repeat_interleave``, ``reorder_cache``, ``crop``,
``offload``/``prefetch`` and ``reset``; importing this module registers nothing in transformers.
"""

from __future__ import annotations

import functools
import inspect

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer


class GrowingLayer(DynamicLayer):
    """A ``DynamicLayer`` backed by a buffer with room to spare; ``keys``/``values`` are views."""

    #: spare slots allocated beyond the first forward (a prefill) before the first doubling
    initial_room = 256
    # never registered as transformers' class for a layer type: only ``growing_cache`` uses it
    _layer_type = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self._kbuf = self._vbuf = None
        self._length = 0

    def _room_for(self, key_states: torch.Tensor, value_states: torch.Tensor, needed: int) -> None:
        capacity = 0 if self._kbuf is None else self._kbuf.shape[-2]
        if needed <= capacity:
            return
        new_cap = max(needed + self.initial_room, 2 * capacity)
        kbuf = key_states.new_empty((*key_states.shape[:-2], new_cap, key_states.shape[-1]))
        vbuf = value_states.new_empty((*value_states.shape[:-2], new_cap, value_states.shape[-1]))
        if self._length:
            kbuf[..., : self._length, :] = self._kbuf[..., : self._length, :]
            vbuf[..., : self._length, :] = self._vbuf[..., : self._length, :]
        self._kbuf, self._vbuf = kbuf, vbuf

    def _set_views(self) -> None:
        self.keys = self._kbuf[..., : self._length, :]
        self.values = self._vbuf[..., : self._length, :]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = key_states.shape[-2]
        self._room_for(key_states, value_states, self._length + n)
        self._kbuf[..., self._length : self._length + n, :] = key_states
        self._vbuf[..., self._length : self._length + n, :] = value_states
        self._length += n
        self._set_views()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self._length if self.is_initialized else 0

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.get_seq_length() > 0:  # keeps the spare room: the rows left go on decoding
            self._kbuf = self._kbuf.index_select(0, indices)
            self._vbuf = self._vbuf.index_select(0, indices)
            self._set_views()

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.get_seq_length() > 0:
            self._kbuf = self._kbuf.repeat_interleave(repeats, dim=0)
            self._vbuf = self._vbuf.repeat_interleave(repeats, dim=0)
            self._set_views()

    def reorder_cache(self, beam_idx: torch.Tensor) -> None:
        self.batch_select_indices(beam_idx.to(self._kbuf.device) if self.get_seq_length() > 0 else beam_idx)

    def offload(self) -> None:
        if self.is_initialized and self._kbuf is not None:
            self._kbuf = self._kbuf.to("cpu", non_blocking=True)
            self._vbuf = self._vbuf.to("cpu", non_blocking=True)
            self._set_views()

    def prefetch(self) -> None:
        if self.is_initialized and self._kbuf is not None and self._kbuf.device != self.device:
            self._kbuf = self._kbuf.to(self.device, non_blocking=True)
            self._vbuf = self._vbuf.to(self.device, non_blocking=True)
            self._set_views()

    def compact(self, index: torch.Tensor) -> None:
        """Keep, for each row ``b``, the slots ``index[b]`` (``[B, W]``, in that order) as the first ``W``
        slots: the buffers are gathered in place, the spare room stays."""
        if not self.is_initialized or self._kbuf is None:
            return
        B, W = index.shape
        index = index.to(self._kbuf.device)
        shape = (B, self._kbuf.shape[1], W, self._kbuf.shape[-1])
        g = index[:, None, :, None].expand(shape)
        keys = self._kbuf[..., : self._length, :].gather(2, g)
        values = self._vbuf[..., : self._length, :].gather(2, g)
        self._kbuf[..., :W, :] = keys
        self._vbuf[..., :W, :] = values
        self._length = W
        self._set_views()

    def merge(self, other: GrowingLayer, pads: tuple[int, int], rows: tuple[int, int],
              keep: torch.Tensor | None = None) -> None:
        """This layer's rows ``keep`` (all when None) then ``other``'s, each left-padded with ``pads``
        zero slots (see ``merge_caches``), written once into a new buffer that keeps room to grow."""
        have = [layer for layer in (self, other) if layer.is_initialized and layer._kbuf is not None]
        if not have:
            return
        ref = have[0]._kbuf
        width = max(pads[0] + self.get_seq_length(), pads[1] + other.get_seq_length())
        shape = (rows[0] + rows[1], ref.shape[1], width + self.initial_room, ref.shape[-1])
        kbuf, vbuf = ref.new_empty(shape), ref.new_empty(shape)
        at = 0
        for layer, pad, n, sel in ((self, pads[0], rows[0], keep), (other, pads[1], rows[1], None)):
            for buf, src in ((kbuf, layer.keys if layer.get_seq_length() else None),
                             (vbuf, layer.values if layer.get_seq_length() else None)):
                buf[at : at + n, :, :pad].zero_()
                if src is not None:
                    buf[at : at + n, :, pad:width] = src if sel is None else src.index_select(0, sel)
                else:
                    buf[at : at + n, :, pad:width].zero_()
            at += n
        if not self.is_initialized:
            self.lazy_initialization(kbuf[..., :0, :], vbuf[..., :0, :])
        self._kbuf, self._vbuf = kbuf, vbuf
        self._length = width
        self._set_views()

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes a negative count of slots to drop, not {tokens_to_remove}")
        if tokens_to_remove == 0 or not self.is_initialized:
            return
        self._length = max(self._length + tokens_to_remove, 0)
        self._set_views()

    def reset(self) -> None:
        self._kbuf = self._vbuf = None
        self._length = 0
        super().reset()


class MergeError(RuntimeError):
    """Two batches' caches cannot be joined (a layer type that does not hold every slot)."""


def merge_caches(cache: DynamicCache, other: DynamicCache, pads: tuple[int, int], rows: tuple[int, int],
                 keep: torch.Tensor | None = None) -> None:
    """Append ``other``'s rows to ``cache``'s rows ``keep`` (all when None; the rest leave),
    layer by layer, in place: each side's slots are left-padded with ``pads`` zero slots (masked by
    the caller) to one width. ``rows``: each side's batch size after ``keep`` (a layer that never
    ran, e.g. a head's cache right after the prefill, has no slots). Only ``GrowingLayer``s can be
    joined: a sliding-window layer has dropped slots."""
    if len(cache.layers) != len(other.layers):
        raise MergeError(f"caches of {len(cache.layers)} and {len(other.layers)} layers")
    for la, lb in zip(cache.layers, other.layers, strict=True):
        if not (isinstance(la, GrowingLayer) and isinstance(lb, GrowingLayer)):
            raise MergeError(f"a {type(la if not isinstance(la, GrowingLayer) else lb).__name__} layer keeps only "
                             "part of its slots")
        la.merge(lb, pads, rows, keep)


def growing_cache(config) -> DynamicCache:
    """A ``DynamicCache`` for ``config`` whose plain (full-attention) layers grow in place."""
    cache = DynamicCache(config=config)
    cache.layers = [GrowingLayer() if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache


def cache_kwarg(model) -> str:
    """The keyword ``model``'s forward takes its KV cache by: ``cache`` (transformers from about 5.24)
    or ``past_key_values`` (earlier 5.x releases, e.g. the 5.19 that vLLM 0.32 installs, pass an
    unknown ``cache=`` on to ``**kwargs`` and silently run every forward without the cache)."""
    return _cache_kwarg(type(model))


@functools.cache
def _cache_kwarg(cls) -> str:
    fn = getattr(cls, "forward", None) or cls.__call__  # a module's forward; any other callable's call
    params = inspect.signature(fn).parameters
    return "past_key_values" if "past_key_values" in params and "cache" not in params else "cache"
