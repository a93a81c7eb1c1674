"""Measure a pair's step costs on its device: the cost table the AV replay needs.

``draft_ms[batch][k]``: the drafter proposing k tokens (k sequential one-token forwards) for a batch
of requests; ``verify_ms[tokens]``: one target forward over that many new tokens in a batch (rows x
tokens per row). Each figure is the median of timed repeats after a discarded warm-up, over a
KV cache holding ``context`` tokens per row (cropped back after every repeat).
"""

from __future__ import annotations

import time
from collections import defaultdict

import numpy as np
import torch

from svt.errors import ConfigError
from svt.simulate.costs import CostTable


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _reset(cache, context: int) -> None:
    """Drop everything after the first ``context`` slots (transformers 5: crop takes -count)."""
    extra = cache.get_seq_length() - context
    if extra > 0:
        cache.crop(-extra)


@torch.inference_mode()
def _prefill(model, batch: int, context: int, device):
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    ids = torch.randint(10, model.config.vocab_size, (batch, context), device=device,
                        generator=torch.Generator(device=device).manual_seed(0))
    model(input_ids=ids, cache=cache, use_cache=True)
    return cache


DEFAULT_BATCHES = (1, 2, 4, 8, 16, 32, 64)


def parse_batches(text: str | None) -> tuple[int, ...]:
    """``"1,8,64"`` -> (1, 8, 64); None -> the default sizes. Sizes must be distinct integers >= 1."""
    if text is None:
        return DEFAULT_BATCHES
    try:
        sizes = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise ConfigError(f"Expected --profile-batches as integers separated by commas, e.g. 1,8,64, but got "
                          f"{text!r}.") from None
    if not sizes or min(sizes) < 1 or len(set(sizes)) != len(sizes) or max(sizes) > 4096:
        raise ConfigError(f"Expected distinct batch sizes in [1, 4096], but got {text!r}.")
    return tuple(sorted(sizes))


@torch.inference_mode()
def profile_pair(target, draft, *, k: int, batches=DEFAULT_BATCHES, context: int = 128,
                 repeats: int = 5, progress=None) -> CostTable:
    device = next(target.parameters()).device
    draft_ms: dict[int, dict[int, float]] = {}
    verify: dict[int, list[float]] = defaultdict(list)
    for b in batches:
        cache = _prefill(draft, b, context, device)
        tok = torch.full((b, 1), 11, device=device)
        runs = []
        for rep in range(repeats + 1):  # the first is a warm-up
            times = []
            _sync(device)
            t0 = time.perf_counter()
            for _ in range(k):
                draft(input_ids=tok, cache=cache, use_cache=True)
                _sync(device)
                times.append((time.perf_counter() - t0) * 1e3)
            _reset(cache, context)
            if rep:
                runs.append(times)
        med = np.median(np.array(runs), axis=0)
        draft_ms[b] = {j + 1: float(med[j]) for j in range(k)}
        cache = _prefill(target, b, context, device)
        for m in range(1, k + 2):
            ids = torch.full((b, m), 11, device=device)
            samples = []
            for rep in range(repeats + 1):
                _sync(device)
                t0 = time.perf_counter()
                target(input_ids=ids, cache=cache, use_cache=True)
                _sync(device)
                if rep:
                    samples.append((time.perf_counter() - t0) * 1e3)
                _reset(cache, context)
            verify[b * m].append(float(np.median(samples)))
        if progress is not None:
            progress(b)
    return CostTable("measured", "autoregressive",
                     f"measured on {device} with context {context}, median of {repeats} repeats",
                     draft_ms, {t: float(np.mean(v)) for t, v in sorted(verify.items())})
