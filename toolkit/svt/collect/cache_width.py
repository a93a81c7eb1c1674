"""How wide svt's engine's target cache is at each verify forward, replayed without a model.

A verify forward's attention reads every slot of the target cache, and the cache is wider than a
row's own tokens: rows are left-padded to the longest prompt of their prefill group, a request
admitted into a free slot is padded to the batch's current width, and the slots of rejected drafts
stay as masked holes until a compaction drops them (at least ``COMPACT_MIN_HOLES`` slots and
``COMPACT_SHARE`` of the width, :class:`svt.collect.engine._Cache`). A cost table timed at the mean
row's context under-prices those forwards (measured on the demo pair at batch 16, K = 3: the engine
attended 509 slots where the mean row held 418; a verify forward cost 7.5 % more).

The width depends only on the schedule's bookkeeping: prompt lengths, the slots, K, the tokens a
request decodes and how many drafts each row accepts at each step. :func:`engine_widths` replays
that bookkeeping exactly as :func:`svt.collect.engine.run_batch` does it (fixed K, no live AV
trimming, no end-of-text stops; continuous batching or the collector's static batches). Fed a
run's own accepted counts it gives that run's ``verify_slots`` step for step (tested). Fed accepted
counts drawn from a measured distribution it gives the width a collection of those prompts will
attend, at any batch size, in milliseconds. :func:`svt.collect.profile.profile_pair` times the cost
cells at that width.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from svt.collect.engine import COMPACT_MIN_HOLES, COMPACT_SHARE

#: engine steps :func:`mean_width` averages over, about: fewer seeded rounds when one round is
#: longer (a round of 5,000 steps takes about 0.1 s here) ...
STEPS_A_ROUND = 5_000
#: ... and at most this many steps in its one round (the first prompts that fill them)
MAX_STEPS = 25_000

#: ``accepted(requests, tick)``: the drafts each of these requests (indices into the prompts)
#: accepts at engine step ``tick``
Accepted = Callable[[np.ndarray, int], np.ndarray]


def engine_widths(prompt_lengths, slots: int | None, k: int, max_new_tokens: int, accepted: Accepted,
                  compacts: bool = True, static: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Each engine step's batch size and the target cache's width at its verify forward (the
    schedule table's ``batch_size`` and ``verify_slots``) for prompts of ``prompt_lengths`` (in
    admission order) decoding ``max_new_tokens`` each through ``slots`` rows (None: all at once),
    ``k`` drafts a step (0: plain decoding): continuous batching, or with ``static`` the collector's
    static batches (each ``slots`` prompts run alone until the last finishes). ``compacts=False``: a
    cache that cannot compact (sliding-window layers)."""
    lengths = np.asarray(prompt_lengths, dtype=np.int64)
    if lengths.size == 0 or (lengths < 1).any():
        raise ValueError("prompt lengths must be at least 1 token, and there must be one")
    n = lengths.size
    slots = n if slots is None else max(1, int(slots))
    rows = np.zeros(0, dtype=np.int64)  # the requests decoding
    live = np.zeros(0, dtype=np.int64)  # their live slots
    out = np.zeros(0, dtype=np.int64)  # their tokens emitted
    width = admitted = tick = 0
    batch, widths = [], []
    while admitted < n or rows.size:
        new = min(slots - rows.size, n - admitted) if not (static and rows.size) else 0
        if new > 0:  # prefill: prompt[:-1] left-padded to the group's longest; joined padded to the batch
            group = lengths[admitted : admitted + new]
            w = max(int(group.max()) - 1, 1)
            width = max(width, w) if rows.size else w
            rows = np.concatenate([rows, np.arange(admitted, admitted + new)])
            live = np.concatenate([live, group - 1])
            out = np.concatenate([out, np.zeros(new, dtype=np.int64)])
            admitted += new
        width += k + 1  # the verify forward appends y and the K drafts to every row
        batch.append(rows.size)
        widths.append(width)
        acc = np.clip(np.asarray(accepted(rows, tick), dtype=np.int64), 0, k)
        live = live + acc + 1
        out = out + acc + 1
        stay = out < max_new_tokens
        # rows finishing while prompts wait leave in the next admission's merge (engine
        # ``end_step(defer=...)``): the step's compaction still counts their slots
        top = int(live.max()) if not static and admitted < n else 0
        rows, live, out = rows[stay], live[stay], out[stay]
        if compacts and rows.size:
            top = max(top, int(live.max()))
            holes = width - top
            if holes >= COMPACT_MIN_HOLES and holes >= COMPACT_SHARE * width:
                width = top
        tick += 1
    return np.asarray(batch, dtype=np.int64), np.asarray(widths, dtype=np.int64)


def mean_width(prompt_lengths, slots: int, k: int, max_new_tokens: int, accept_counts: np.ndarray,
               rounds: int = 5, seed: int = 0, compacts: bool = True, static: bool = False) -> float:
    """The mean width the verify forwards attend at full batch (``slots`` rows, or every prompt
    when there are fewer), each row's accepted count drawn from ``accept_counts`` (how often 0..k
    drafts were accepted in measured steps), averaged over ``rounds`` seeded draws. Rows run to
    ``max_new_tokens`` (no end-of-text stop) and verify every draft (no live AV trimming): a run
    that stops early or trims attends less."""
    counts = np.asarray(accept_counts, dtype=np.float64)[: k + 1]
    if counts.sum() <= 0:
        raise ValueError("no accepted counts to draw from")
    p = counts / counts.sum()
    # a long replay needs fewer seeded rounds (each averages thousands of steps); past MAX_STEPS
    # steps a round it keeps the first prompts, in order, that fill them (at least four batches'
    # worth): the time stays bounded for long outputs and many prompts
    per_step = float(p @ np.arange(p.size)) + 1.0
    n, cap = len(prompt_lengths), max(int(max_new_tokens), 1)
    steps = n * cap / (max(1, int(slots)) * per_step)
    rounds = int(np.clip(round(rounds * STEPS_A_ROUND / max(steps, 1.0)), 1, rounds))
    if steps > MAX_STEPS:
        prompt_lengths = list(prompt_lengths)[: max(4 * int(slots), 16, int(n * MAX_STEPS / steps))]
    means = []
    for r in range(rounds):
        rng = np.random.default_rng(seed + r)
        b, w = engine_widths(prompt_lengths, slots, k, max_new_tokens,
                             lambda req, _t, rng=rng: rng.choice(p.size, size=req.size, p=p), compacts=compacts,
                             static=static)
        full = b == min(slots, len(prompt_lengths))
        means.append(float(w[full].mean()))
    return float(np.mean(means))
