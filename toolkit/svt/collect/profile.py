"""Measure a pair's step costs on its device: the cost table the AV replay needs.

``draft_ms[batch][k]``: the drafter proposing k tokens (k sequential one-token forwards) for a batch
of requests (a hidden-state head: the fusion of the target's taps and a catch-up forward of k + 1
slots for the first draft, then one-slot forwards, as the engine drafts);
``verify_rows_ms[rows][tokens a row]``: one target forward over that many rows of new tokens. The
table holds the cost model fitted to the repeats (:mod:`svt.collect.cost_fit`). Each figure is the median of timed repeats after a discarded warm-up, over a
KV cache holding ``context`` tokens per row (cropped back after every repeat). The repeats are
taken in interleaved passes, every cell once a pass in a fresh order (:func:`_interleaved`), so a
machine whose speed drifts while it is profiled moves every cell alike; how much it drifted is kept
(``measurement.drift``).

How sure the table is goes with it (``CostTable.measurement``): each entry's spread over its repeats
(interquartile range / median), the machine's load against the cores available before and after, the
threads, and ``warnings`` when the figures may not be the machine's: a spread above
``SPREAD_WARN``, other processes' load (the load average at the end less this process's threads)
above half the cores, or a draft or verify time that falls as the batch grows
beyond the noise (a busy machine's signature: the 24 ms at batch 1 against 1.4 ms at batch 4 that
made a replay show speculation losing 6x).
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch

from svt.collect.head_draft import is_head
from svt.collect.kv_cache import cache_kwarg
from svt.devices import machine_load
from svt.errors import ConfigError
from svt.simulate.costs import CostTable

SPREAD_WARN = 0.3  # interquartile range / median over an entry's repeats above this: a noisy measurement
MONOTONE_SLACK = 0.25  # a time may fall by this share (or its spread, if larger) as the batch grows


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _forward(model):
    """The forward the collector runs ``model`` with (:mod:`svt.models.lean` where it applies)."""
    from svt.models.lean import lean_forward

    return lean_forward(model) or model


def _reset(cache, context: int) -> None:
    """Drop everything after the first ``context`` slots (transformers 5: crop takes -count)."""
    extra = cache.get_seq_length() - context
    if extra > 0:
        cache.crop(-extra)


@torch.inference_mode()
def _prefill(model, batch: int, context: int, device):
    from svt.collect.kv_cache import growing_cache

    probe = growing_cache(model.config)
    _forward(model)(input_ids=torch.full((1, 1), 11, device=device), use_cache=True, **{cache_kwarg(model): probe})
    cache = _random_like(probe, growing_cache(model.config), batch, context, device)
    if cache is None:  # layers whose state is more than keys and values: a real forward fills them
        cache = growing_cache(model.config)
        ids = torch.randint(10, model.config.vocab_size, (batch, context), device=device,
                            generator=torch.Generator(device=device).manual_seed(0))
        _forward(model)(input_ids=ids, use_cache=True, **{cache_kwarg(model): cache})
    return cache


@torch.inference_mode()
def _prefill_head(head, batch: int, context: int, device):
    """A hidden-state head's cache holding ``context`` slots a row (random keys and values, as
    :func:`_random_like` says)."""
    from svt.collect.kv_cache import growing_cache

    def run(cache, b: int, n: int):
        g = torch.Generator(device=device).manual_seed(0)
        feat = torch.randn((b, n, head.cfg.hidden_size), device=device, generator=g, dtype=next(head.parameters()).dtype)
        head(torch.randint(10, head.cfg.vocab_size, (b, n), device=device, generator=g), feat,
             torch.ones((b, n), dtype=torch.long, device=device), torch.arange(n, device=device)[None].expand(b, -1), cache)
        return cache

    probe = run(growing_cache(head.config), 1, 1)
    cache = _random_like(probe, growing_cache(head.config), batch, context, device)
    return cache if cache is not None else run(growing_cache(head.config), batch, context)


def _random_like(probe, cache, batch: int, context: int, device):
    """``cache`` filled with ``context`` slots a row for ``batch`` rows of standard-normal keys and
    values, each layer in the head count, head size and dtype a one-slot forward wrote into
    ``probe``, in place of a forward over ``context`` random tokens: a forward's time depends on
    the cache's shape, not its contents, and those prefills (up to 64 rows x 570 slots on the demo
    config) were a quarter of a profile's time. None when a layer holds more than keys and values
    (or none: shared or indexed layers, linear-attention state), which only a forward fills."""
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

    from svt.collect.kv_cache import GrowingLayer

    plain = (GrowingLayer, DynamicLayer, DynamicSlidingWindowLayer)
    if not all(type(layer) in plain and isinstance(layer.keys, torch.Tensor) for layer in probe.layers):
        return None
    g = torch.Generator(device=device).manual_seed(0)
    for i, layer in enumerate(probe.layers):
        k, v = layer.keys, layer.values
        cache.update(torch.randn((batch, k.shape[1], context, k.shape[-1]), generator=g, device=device, dtype=k.dtype),
                     torch.randn((batch, v.shape[1], context, v.shape[-1]), generator=g, device=device, dtype=v.dtype), i)
    return cache


@torch.inference_mode()
def _block_draft_times(model, cache, batch: int, k: int, context: int, device) -> list[float]:
    """Cumulative ms after each of ``k`` drafts as svt's engine drafts with a block drafter
    (:mod:`svt.collect.block_draft`): the fusion of ``k + 1`` catch-up slots' taps and one forward
    over them and the block (the first draft), then each slot's LM head (and DSpark's Markov and
    confidence heads) and its sample, in order: drafting k costs one pass and k small steps."""
    from svt.collect.block_draft import block_ids
    from svt.collect.sampling import process_probs, sample_tokens

    dt = next(model.parameters()).dtype
    n_ctx, bs = k + 1, model.cfg.block_size
    taps = torch.randn((batch, n_ctx, len(model.cfg.aux_layer_ids) * model.cfg.target_hidden_size), device=device,
                       dtype=dt)
    anchor = torch.full((batch,), 11, device=device)
    ids = torch.cat([torch.full((batch, n_ctx), 11, device=device), block_ids(model, anchor)], 1)
    width = context + n_ctx + bs
    times = []
    t0 = time.perf_counter()
    o = model(ids, model.fuse(taps), torch.ones((batch, width), dtype=torch.long, device=device),
              context + torch.arange(n_ctx + bs, device=device)[None].expand(batch, -1), cache, block=bs)
    h = model.draft_slots(o.hidden)
    prev = anchor
    for i in range(min(k, h.shape[1])):
        q = process_probs(model.slot_logits(h[:, i], prev), 1.0, 1.0)
        model.confidence(h[:, i], prev)
        prev = sample_tokens(q, None)
        _sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return times


@torch.inference_mode()
def _head_draft_times(head, cache, batch: int, k: int, context: int, device) -> list[float]:
    """Cumulative ms after each of ``k`` drafts as svt's engine drafts with a head: the fusion of the
    target's taps and the catch-up forward of ``k + 1`` slots (the first draft), then ``k - 1``
    one-slot forwards on the head's own features (:mod:`svt.collect.head_draft`)."""
    dt = next(head.parameters()).dtype
    taps = torch.randn((batch, k + 1, len(head.cfg.aux_layer_ids) * head.cfg.target_hidden_size), device=device,
                       dtype=dt)
    ids = torch.full((batch, k + 1), 11, device=device)
    times = []
    t0 = time.perf_counter()
    width = context + k + 1
    o = head(ids, head.fuse(taps), torch.ones((batch, width), dtype=torch.long, device=device),
             context + torch.arange(k + 1, device=device)[None].expand(batch, -1), cache)
    _sync(device)
    times.append((time.perf_counter() - t0) * 1e3)
    for j in range(1, k):
        width += 1
        o = head(ids[:, :1], o.hidden[:, -1:], torch.ones((batch, width), dtype=torch.long, device=device),
                 torch.full((batch, 1), context + k + j, device=device), cache)
        _sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return times


DEFAULT_BATCHES = (1, 2, 4, 8, 16, 32, 64)
# a verify sample is the mean of enough forwards to last this long: a single 2 ms forward is at
# the mercy of one scheduler tick (IQRs of 40 % on a quiet 2-core machine), ten of them are not
SAMPLE_MS = 10.0
MAX_INNER = 16
REPEATS = 15  # timed repeats a cell: enough, mostly, for the cost model's bootstrap interval to pin each cost
EXTRA_ROUNDS = 2  # then the cells still uncertain are measured again, REPEATS more each round


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


def _spread(samples) -> float:
    """The interquartile range over the median: one slow repeat (a collector pause) does not move
    it; a machine busy for part of the profile does."""
    a = np.asarray(samples, dtype=np.float64)
    med = float(np.median(a))
    q1, q3 = np.percentile(a, [25, 75])
    return float((q3 - q1) / med) if med > 0 else 0.0


def falls_with_batch(times: dict[int, float], spread: dict[int, float]) -> list[str]:
    """Where a time at a larger batch is below a smaller batch's by more than the noise allows."""
    out = []
    batches = sorted(times)
    for i, b in enumerate(batches):
        for c in batches[i + 1:]:
            slack = max(MONOTONE_SLACK, spread.get(b, 0.0), spread.get(c, 0.0))
            if times[c] < times[b] * (1 - slack):
                out.append(f"{times[b]:.3g} ms at {b} > {times[c]:.3g} ms at {c}")
    return out


def measurement_block(repeats: int, spreads: dict[str, dict], falls: dict[str, list[str]],
                      before: dict, after: dict, fit: dict | None = None) -> dict:
    """``CostTable.measurement``: what the figures rest on, and the warnings (see the module). With
    ``fit`` (the cost model's record, :mod:`svt.collect.cost_fit`) the table is the fitted one and is
    judged by the fit (its residuals, its repeats) and the machine's load; the raw cells' spreads
    and falls are kept as information (``raw_notes``)."""
    warnings, notes = [], []
    worst = {what: max(s.values(), default=0.0) for what, s in spreads.items()}
    for what, w in worst.items():
        if w > SPREAD_WARN:
            notes.append(f"{what} times' interquartile range reaches {w:.0%} of their median over {repeats} repeats")
    for what, found in falls.items():
        if found:
            notes.append(f"{what} time falls as the batch grows ({'; '.join(found[:3])})")
    if fit is None:
        warnings += notes
    else:
        from svt.collect.cost_fit import fit_notes, fit_warnings

        warnings += fit_warnings(fit)
        notes += fit_notes(fit)
    if before["threads"] > before["cores"]:  # its own load is then anywhere up to its threads
        warnings.append(f"{before['threads']} threads on {before['cores']} cores: the times include threads waiting "
                        "for each other, and other processes' load cannot be told from this one's (profile with "
                        "--threads at most the cores)")
    else:  # the load average lags and counts this process's own threads: what the others added at the end
        others = after["load_1min"] - after["threads"]
        if others > before["cores"] / 2:  # NaN (no load average) compares False
            warnings.append(f"other processes kept {others:.1f} of the machine's {before['cores']} cores busy")
    return {"repeats": repeats, "threads": before["threads"], "cores": before["cores"],
            "load_1min_before": before["load_1min"], "load_1min_after": after["load_1min"],
            "max_spread": {k: round(v, 3) for k, v in worst.items()}, "warnings": warnings,
            "reliable": not warnings,
            **({"fit": fit, "raw_notes": notes} if fit is not None else {})}


class _DraftCell:
    """One batch size's drafts: each sample is the cumulative ms after each of ``k`` drafts (a
    hidden-state or block drafter drafts as the engine does; a draft model runs ``k`` one-token
    forwards), over its own cache of ``context`` slots, cropped back after every sample."""

    @torch.inference_mode()
    def __init__(self, draft, b: int, k: int, context: int, device):
        from svt.collect.block_draft import is_block

        self.draft, self.b, self.k, self.context, self.device = draft, b, k, context, device
        self.head = is_head(draft)
        self.run = _forward(draft)
        self.cache = _prefill_head(draft, b, context, device) if self.head else _prefill(draft, b, context, device)
        self.tok = torch.full((b, 1), 11, device=device)
        self.timer = _block_draft_times if is_block(draft) else _head_draft_times

    @torch.inference_mode()
    def sample(self) -> list[float]:
        _sync(self.device)
        times = self.timer(self.draft, self.cache, self.b, self.k, self.context, self.device) if self.head else []
        t0 = time.perf_counter()
        for _ in range(0 if self.head else self.k):
            self.run(input_ids=self.tok, use_cache=True, **{cache_kwarg(self.draft): self.cache})
            _sync(self.device)
            times.append((time.perf_counter() - t0) * 1e3)
        _reset(self.cache, self.context)
        return times


class _VerifyCell:
    """One target forward over ``b`` rows of ``m`` new tokens: each sample is the mean ms of enough
    forwards to last ``SAMPLE_MS`` (counted at the first sample, the warm-up), over a cache of
    ``context`` slots a row shared by the cells of one batch size and cropped back after each."""

    def __init__(self, target, b: int, m: int, cache, context: int, device):
        self.target, self.cache, self.context, self.device = target, cache, context, device
        self.run = _forward(target)
        self.ids = torch.full((b, m), 11, device=device)
        self.inner = None

    @torch.inference_mode()
    def sample(self) -> float:
        t = 0.0
        for _ in range(self.inner or 1):
            _sync(self.device)
            t0 = time.perf_counter()
            self.run(input_ids=self.ids, use_cache=True, **{cache_kwarg(self.target): self.cache})
            _sync(self.device)
            t += time.perf_counter() - t0
            _reset(self.cache, self.context)
        if self.inner is None:  # the warm-up: enough forwards per sample that one lasts SAMPLE_MS
            self.inner = min(MAX_INNER, max(1, math.ceil(SAMPLE_MS / max(t * 1e3, 1e-3))))
            return t * 1e3
        return t * 1e3 / self.inner


def _interleaved(cells: list, repeats: int, seed: int) -> tuple[list[list], list[float]]:
    """``repeats`` samples of every cell after one warm-up each, taken in passes: each pass samples
    every cell once, in a fresh seeded order. A machine whose speed drifts while it is profiled
    (measured on a quiet 2-core VM: one fixed forward's median moved 6.1-12.3 ms within 150 s)
    then slows every cell alike, so the cells' relative costs, on which the replay's decisions
    rest, hold still; measured cell after cell, a slow stretch lands on a few cells and bends the
    table. Returns each cell's samples and each pass's wall-clock (ms): the drift itself."""
    for cell in cells:
        cell.sample()  # warm-up (a verify cell also sets its forwards a sample)
    rng = np.random.default_rng(seed)
    out: list[list] = [[] for _ in cells]
    passes = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for i in rng.permutation(len(cells)):
            out[i].append(cells[i].sample())
        passes.append((time.perf_counter() - t0) * 1e3)
    return out, passes


#: a pass's wall-clock moving more than this share around the passes' median: said in the table's
#: notes (the cells are interleaved, so the drift moves the whole table, not its shape)
DRIFT_NOTE = 0.2


def drift_record(passes: list[float]) -> dict:
    """How the machine's speed moved while it was profiled: each interleaved pass times every cell
    once, so a pass's wall-clock over the passes' median is the machine's speed at that moment."""
    a = np.asarray(passes, dtype=np.float64)
    med = float(np.median(a)) if a.size else 0.0
    rel = a / med if med > 0 else np.ones_like(a)
    return {"passes": int(a.size), "pass_ms_median": round(med, 3),
            "slowest": round(float(rel.max(initial=1.0)), 3), "fastest": round(float(rel.min(initial=1.0)), 3),
            "range": round(float(rel.max(initial=1.0) - rel.min(initial=1.0)), 3)}


def drift_note(d: dict) -> str:
    return (f"the machine's speed moved while it was profiled: interleaved passes over every cell took "
            f"{d['fastest']:.2f}-{d['slowest']:.2f}x their median ({d['passes']} passes); the cells moved together, "
            "so the table's shape holds, but its level is this profile's average: a replay's absolute tokens/s "
            "is only as steady as the machine")


def _measure(target, draft, draft_batches, verify_cells: dict[int, list[int]], k: int, repeats: int,
             contexts: dict[int, int], device, seed: int = 0) -> tuple[dict[int, np.ndarray], dict[tuple[int, int], list[float]], list[float]]:
    """Draft times at each of ``draft_batches`` (one row of cumulative ms per repeat) and verify
    samples at each (batch, tokens a row) of ``verify_cells``, every cell interleaved with every
    other (:func:`_interleaved`); with each pass's wall-clock. A batch size's cells hold
    ``contexts[b]`` slots a row."""
    cells, keys = [], []
    for b in draft_batches:
        cells.append(_DraftCell(draft, b, k, contexts[b], device))
        keys.append(("draft", b))
    for b, widths in verify_cells.items():
        cache = _prefill(target, b, contexts[b], device)
        for m in widths:
            cells.append(_VerifyCell(target, b, m, cache, contexts[b], device))
            keys.append(("verify", (b, m)))
    samples, passes = _interleaved(cells, repeats, seed)
    draft_raw = {key: np.array(s) for (what, key), s in zip(keys, samples, strict=True) if what == "draft"}
    verify_raw = {key: list(s) for (what, key), s in zip(keys, samples, strict=True) if what == "verify"}
    return draft_raw, verify_raw, passes


def _uncertain_cells(draft_fit: dict, verify_fit: dict, record: dict) -> tuple[list[int], dict[int, list[int]]]:
    """The draft batches and verify (rows, tokens a row) cells the fit does not pin down: a fitted
    value whose 95 % interval reaches further than MAX_UNCERTAINTY from it, or a median further than
    MAX_RESIDUAL from the fit (a stretch of the machine busy while that cell ran): the cells to
    measure again. Their new repeats join the old, so a disturbed stretch is outvoted, not erased."""
    from svt.collect.cost_fit import MAX_RESIDUAL, MAX_UNCERTAINTY

    def off(lo_hi, value, residual):
        return max(value - lo_hi[0], lo_hi[1] - value) > MAX_UNCERTAINTY * value or abs(residual) > MAX_RESIDUAL

    iv, res = record["interval95"], record["residuals"]
    draft = [b for b, row in iv["draft"].items()
             if any(off(x, draft_fit[b][j], res["draft"][b][j]) for j, x in row.items())]
    verify = {b: [m for m, x in row.items() if off(x, verify_fit[b][m], res["verify"][b][m])]
              for b, row in iv["verify"].items()}
    return draft, {b: ms for b, ms in verify.items() if ms}


def collection_prompts(cfg, config_path, tokenizer) -> list[list[int]]:
    """The config's requests' prompts, encoded as the collection encodes them (token ids)."""
    from svt.collect.encode import encode_workloads, head_fits
    from svt.collect.workloads import load_workloads

    keep = head_fits(tokenizer, cfg.max_prompt_tokens, cfg.max_new_tokens) if cfg.on_long_head == "skip" else None
    workloads = load_workloads(cfg.workloads, cfg.requests, config_path, turns=cfg.turns, repeat=cfg.repeat, keep=keep)
    encoded = encode_workloads(workloads, tokenizer, cfg.max_prompt_tokens, cfg.max_new_tokens, cfg.on_long_head)
    return [list(e.prompt_ids) for e in encoded]


def collection_context(prompts: list[list[int]], max_new_tokens: int) -> int:
    """The context the requests decode at on average: the mean prompt length plus half of
    ``max_new_tokens`` (the middle of the decode); 128 with no prompts. Forwards cost more the
    longer the cache they attend to; the engine attends more than this (padding, holes), which
    :func:`profile_pair` measures when given the prompts."""
    if not prompts:
        return 128
    return int(round(np.mean([len(p) for p in prompts]) + max_new_tokens / 2))


def profile_pair(target, draft, *, k: int, batches=DEFAULT_BATCHES, context: int = 128,
                 repeats: int = REPEATS, progress=None, verify_tokens: int | None = None,
                 prompts: list[list[int]] | None = None, max_new_tokens: int = 0, static: bool = False,
                 temperature: float = 1.0, top_p: float = 1.0) -> CostTable:
    """The pair's cost table (see the module), with how sure it is in ``measurement``. Verification
    is timed for 1 to ``verify_tokens`` tokens a row (default ``k + 1``; a tree config passes its
    size + 1: a tree of n nodes is verified in one forward over n + 1 tokens a row). Cells the fit
    does not pin down (:func:`_uncertain_cells`) are measured again, ``repeats`` more each time, up
    to ``EXTRA_ROUNDS`` times; the fit is judged after, on every repeat.

    The context the cells attend: with ``prompts`` (the collection's own, encoded, decoding
    ``max_new_tokens`` each), the engine's steps timed first for ``step_ms`` decode some of them and
    count how many drafts each row accepted at k = ``k``; each batch size's cells then hold the width
    the engine's target cache will have at its verify forwards when it decodes those prompts through
    that many slots (:func:`svt.collect.cache_width.mean_width`, less the step's own tokens): rows
    padded to the longest, admitted requests padded to the batch (``static``: the collector's static
    batches, no joins), rejected drafts' holes until a compaction. Rows are taken to decode to
    ``max_new_tokens`` and verify every draft: a collection that stops early or trims with live AV
    attends less. Without prompts, every cell holds ``context`` slots. The engine steps sample at
    ``temperature`` and ``top_p`` (the collection's)."""
    from svt.collect.cost_fit import fit_costs

    device = next(target.parameters()).device
    before = machine_load()
    widths = range(1, (verify_tokens or k + 1) + 1)
    step, step_record, accepted = step_overheads(target, draft, k, batches, context, prompts=prompts,
                                                 temperature=temperature, top_p=top_p)
    if progress is not None:
        progress("the engine's steps")
    contexts = engine_contexts(target, prompts, batches, k, max_new_tokens, accepted, static) if prompts \
        else {b: int(context) for b in batches}
    # every repeat, for the cost model
    draft_raw, verify_raw, passes = _measure(target, draft, list(batches), {b: list(widths) for b in batches}, k,
                                             repeats, contexts, device)
    if progress is not None:
        progress(f"{len(draft_raw) + len(verify_raw)} cells, {repeats} interleaved passes")
    remeasured = []
    for rnd in range(EXTRA_ROUNDS):
        again_d, again_v = _uncertain_cells(*fit_costs(draft_raw, verify_raw, replicates=0))
        off = len(again_d) * k + sum(len(ms) for ms in again_v.values())
        if not off or off > (len(draft_raw) * k + len(verify_raw)) / 2:
            break  # nothing to redo, or most of the grid: the machine, not a stretch of it (flagged below)
        remeasured.append({"draft": again_d, "verify": {b: list(ms) for b, ms in again_v.items()}})
        more_d, more_v, _ = _measure(target, draft, again_d, again_v, k, repeats, contexts, device, seed=rnd + 1)
        for b, runs in more_d.items():
            draft_raw[b] = np.concatenate([draft_raw[b], runs])
        for key, samples in more_v.items():
            verify_raw[key] += samples
    spread = {"draft": {b: _spread(r[:, -1]) for b, r in draft_raw.items()},
              "verify": {key: _spread(s) for key, s in verify_raw.items()}}
    falls = {"draft": falls_with_batch({b: float(np.median(r[:, -1])) for b, r in draft_raw.items()}, spread["draft"]),
             "verify": [f"{m} tokens a row: {f}" for m in widths
                        for f in falls_with_batch({b: float(np.median(verify_raw[(b, m)])) for b in batches},
                                                  {b: spread["verify"][(b, m)] for b in batches})]}
    draft_fit, verify_fit, record = fit_costs(draft_raw, verify_raw)
    record["remeasured"] = remeasured
    block = measurement_block(repeats, spread, falls, before, machine_load(), fit=record)
    block["step"] = step_record
    block["drift"] = drift_record(passes)
    # slots a row's cache held in each batch size's cells (svt.report.live shows them)
    block["context"] = {int(b): int(c) for b, c in contexts.items()}
    if block["drift"]["range"] > DRIFT_NOTE:
        block["raw_notes"] = [*block.get("raw_notes", []), drift_note(block["drift"])]
    where = (f"at the cache width the engine attends at each batch ({_contexts_text(contexts)} slots)" if prompts
             else f"with context {context}")
    return CostTable("measured", "autoregressive",
                     f"measured on {device} {where}, {repeats} repeats a cell (more where the fit "
                     f"was uncertain), fitted: {record['model']} (raw medians under measurement.fit); step_ms: "
                     "the engine's per-step work outside its forwards, timed on real engine steps",
                     draft_fit, {}, measurement=block, verify_rows_ms=verify_fit, step_ms=step)


def _contexts_text(contexts: dict[int, int]) -> str:
    return ", ".join(f"B = {b}: {c}" for b, c in sorted(contexts.items()))


def engine_contexts(target, prompts: list[list[int]], batches, k: int, max_new_tokens: int,
                    accepted: np.ndarray, static: bool = False) -> dict[int, int]:
    """Each batch size's cell context: the mean width of the target cache at the engine's verify
    forwards when it decodes ``prompts`` through that many slots (continuous batching, or static
    batches with ``static``; each row accepting as often as ``accepted`` counts), less the step's
    own ``k + 1`` tokens."""
    from svt.collect.cache_width import mean_width
    from svt.collect.kv_cache import GrowingLayer, growing_cache

    compacts = all(isinstance(layer, GrowingLayer) for layer in growing_cache(target.config).layers)
    lengths = [len(p) for p in prompts]
    return {b: max(1, int(round(mean_width(lengths, b, k, max_new_tokens, accepted, compacts=compacts,
                                           static=static))) - (k + 1))
            for b in batches}


#: tokens each row decodes in a (batch, k) cell of ``step_ms`` (after one warm-up decode): enough
#: steps that the engine's periodic work (cache compaction, buffer growth) lands in the mean
OVERHEAD_TOKENS = 64


def step_overheads(target, draft, k: int, batches, context: int, *, prompts: list[list[int]] | None = None,
                   temperature: float = 1.0, top_p: float = 1.0) -> tuple[dict, dict, np.ndarray]:
    """``step_ms[batch][k]`` for k in {0, 1, K}: what a real engine step costs beyond its model
    forwards, the **mean** over the steps of svt's batched engine decoding ``OVERHEAD_TOKENS`` a row
    in one batch (at ``temperature`` and ``top_p``: the collection's; T = 1 by default) of the step's wall-clock minus the time inside its own forwards (timed in
    the same step, the device synchronised around each). It holds the work the forward cells do
    not time: probabilities and sampling, the acceptance test, logging, cache bookkeeping, and the
    engine's periodic work (compacting the caches, growing their buffers), which a median would
    leave out though every run pays it (measured on the demo pair at batch 16: mean steps 1.5x the
    median). Measured within the step, not as the step minus the table's forward cells: that
    difference of two separately timed figures moved from 1.1 to 7.3 ms at batch 8, K = 3, across
    three profiles in a row on a quiet machine, where this one holds still. Batches above 16 are
    timed at the largest only. The rows are ``prompts`` (the collection's, drawn with a fixed seed)
    or, without, random prompts around ``context`` tokens. Returns the table, its raw means, and how
    often a row accepted 0..``k`` drafts at k = ``k`` over every step timed (at k = 0: one count)."""
    from svt.collect.engine import SamplingParams, prefill_rows, run_batch

    device = next(target.parameters()).device
    g = torch.Generator().manual_seed(7)
    timed = sorted({b for b in batches if b <= 16} | {max(batches)})
    vocab = target.config.vocab_size
    table: dict[int, dict[int, float]] = {}
    raw: dict[str, dict[str, float]] = {}
    forwards: dict[str, dict[str, float]] = {}
    accepted = np.zeros(k + 1, dtype=np.int64)
    pick = np.random.default_rng(7)
    for b in timed:
        if prompts:
            rows = [prompts[i] for i in pick.choice(len(prompts), b, replace=len(prompts) < b)]
        else:
            rows = torch.randint(10, vocab, (b, max(context - OVERHEAD_TOKENS // 2, 2)), generator=g).tolist()
        table[b], raw[str(b)], forwards[str(b)] = {}, {}, {}
        # the rows' prompts prefilled once, each k decoding from its own copy (the prefill is outside
        # every step's time; at batch 64 it was half of this table's)
        with torch.inference_mode():
            shared = prefill_rows(target, draft, rows, 0, device, 0, k > 0)
        for kk in sorted({0, min(1, k), k}):
            run_batch(target, draft, [p[-8:] for p in rows], SamplingParams(1.0, 1.0, kk, 3), eos_id=None, pad_id=0,
                      generator=torch.Generator(device=device).manual_seed(0))  # warm-up
            log = run_batch(target, draft, rows, SamplingParams(temperature, top_p, kk, OVERHEAD_TOKENS), eos_id=None,
                            pad_id=0, generator=torch.Generator(device=device).manual_seed(1), sync_forwards=True,
                            start=shared.clone(use_draft=kk > 0))
            sched = {c: np.concatenate(v) for c, v in log.schedule.items()}
            full = sched["batch_size"] == b
            step = float(np.mean(sched["step_ms"][full]))
            fwd = float(np.mean(sched["forward_ms"][full]))
            table[b][kk] = max(step - fwd, 0.0)
            raw[str(b)][str(kk)] = round(step, 4)
            forwards[str(b)][str(kk)] = round(fwd, 4)
            if kk == k:
                got = np.concatenate(log.steps["accepted"]).astype(np.int64)
                accepted += np.bincount(got, minlength=k + 1)[: k + 1]
    rows_are = "the collection's prompts" if prompts else "random prompts around the profile's context"
    return table, {"what": f"mean engine step on {rows_are} (T = {temperature:g}, top-p {top_p:g}) minus the "
                           "time inside its own model forwards",
                   "tokens_a_row": OVERHEAD_TOKENS, "batches": timed, "step_means_ms": raw,
                   "forward_means_ms": forwards, "accepted_counts": accepted.tolist()}, accepted
