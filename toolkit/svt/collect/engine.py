"""The batched speculative-sampling engine: one target and one draft KV cache for a batch of rows.

Cache layout (measured exact against unbatched forwards; tested against fresh forwards): each model keeps one
``DynamicCache`` for the batch (whose layers grow in place: ``svt.collect.kv_cache``); every forward appends the same number of slots to every row;
slots a row does not keep (rejected drafts, padding) stay as *holes* masked out forever by a
cumulative 2D attention mask; ``position_ids`` are each row's count of live tokens, so RoPE positions
stay contiguous per row. Once holes are many (``COMPACT_MIN_HOLES``, ``COMPACT_SHARE``) both caches
are compacted: each row's live slots are gathered, in order, to the right end of a narrower cache, so
attention reads live slots instead of holes (the logits change only by float rounding: the masked
slots had zero weight; on the demo collection tokens and labels are identical, features within 2e-5).

Per step, for rows with pending token y (emitted last step, not yet in either cache):

- draft: feed ``[a, y]`` where ``a`` is x_{K-1} of the previous step if all K drafts were accepted
  (the draft never saw it), else a masked hole; then sample x_0 from the last logits and feed x_0,
  ..., x_{K-2} one at a time (K forwards in all); q_0..q_{K-1} are the processed distributions;
- target: feed ``[y, x_0, ..., x_{K-1}]`` (K + 1 tokens) in one forward, giving p_0..p_K;
- verify: accept the leading run, resample or take the bonus token -> new pending token; keep
  ``accepted + 1`` of the target's new slots and ``accepted`` (+ the hole logic) of the draft's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from svt.collect.block_draft import draft_with_block, is_block
from svt.collect.head_draft import (
    draft_with_head,
    is_head,
    prefill_catch_up,
    prefill_head,
    step_catch_up,
    taps_of,
)
from svt.collect.sampling import draft_features, draft_token, process_probs, q_stats, trim, verify


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    k: int = 5
    max_new_tokens: int = 128

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass
class LiveAV:
    """Live Adaptive Verification: ``confidence(q_features, position) -> [nb, K]`` (numpy; from a
    lossless predictor), the cost table, and the share of steps that verify every draft anyway
    (exploration: uncensored labels for later evaluation)."""

    confidence: object
    costs: object
    explore: float = 0.0
    # an online estimator learning while collecting: observe(labels [nb, K], -1 = none) after each
    # step; warming_up() -> True while every draft must be verified (uncensored warm-up refits)
    observe: object = None
    warming_up: object = None
    rule: str = "convex"  # the budget rule: convex (lossless, default) or engine (the document's)
    # AV+length: each row stops drafting at its own causal length (svt.simulate.av.draft_lengths'
    # rule, one position at a time), then the budget chooses among what was drafted
    length: bool = False
    lengths: object = None  # svt.collect.draft_length.LengthPolicy, made by the engine for a run


@dataclass
class LogOptions:
    hidden: bool = False
    dists_fraction: float = 0.0
    dists_top_k: int = 32


@dataclass
class BatchLog:
    """Everything one batch produced, as numpy columns ready for the trace tables."""

    drafts: dict[str, list[np.ndarray]] = field(default_factory=dict)
    steps: dict[str, list[np.ndarray]] = field(default_factory=dict)
    hidden: list[np.ndarray] = field(default_factory=list)
    dists: dict[str, list] = field(default_factory=dict)
    outputs: list[list[int]] = field(default_factory=list)
    finish: list[str] = field(default_factory=list)
    # one row per engine step (tick): what the scheduler ran and what it cost (svt.traces.schema SCHEDULE)
    schedule: dict[str, list[np.ndarray]] = field(default_factory=dict)

    def add(self, table: dict, **cols) -> None:
        for k, v in cols.items():
            table.setdefault(k, []).append(v)

    def take(self, requests) -> BatchLog:
        """The rows of ``requests`` (ids as logged), moved out of this log into a new one, with every
        schedule row logged so far (a continuous run commits a batch of requests while others decode:
        the steps they shared are committed with the first batch to finish)."""
        got = BatchLog(schedule=self.schedule)
        self.schedule = {}
        want = np.asarray(sorted(requests), dtype=np.int64)
        for name in ("drafts", "steps", "dists"):
            table = getattr(self, name)
            if not table:
                continue
            cols = {k: np.concatenate(v) for k, v in table.items()}
            mine = np.isin(cols["request"], want)
            setattr(got, name, {k: [v[mine]] for k, v in cols.items()})
            setattr(self, name, {k: [v[~mine]] for k, v in cols.items()})
            if name == "drafts" and self.hidden:
                hid = np.concatenate(self.hidden)
                got.hidden, self.hidden = [hid[mine]], [hid[~mine]]
        return got


#: the drafts columns read from the target's distribution: null where live AV trimmed the draft
#: before the target computed it
P_COLUMNS = ("p_sampled", "p_max", "accept_prob", "accept_prob_expected")

#: a cache compacts once at least this many slots are holes that every row masks ...
COMPACT_MIN_HOLES = 64
#: ... and they are at least this share of its slots (so a compaction, one gather of the cache, is
#: paid back by the attention reads it saves over the next steps)
COMPACT_SHARE = 0.25


class _Cache:
    """A model, its growing DynamicCache and the running 2D mask / live counts for a batch."""

    def __init__(self, model, batch: int, device):
        from svt.collect.kv_cache import cache_kwarg, growing_cache
        from svt.models.lean import lean_forward

        self.model = model
        self.run = lean_forward(model) or model  # the same arithmetic without transformers' per-call machinery
        self.cache = growing_cache(model.config)
        self.cache_key = cache_kwarg(model)  # `cache` or `past_key_values`, as this transformers names it
        self.mask = torch.zeros((batch, 0), dtype=torch.long, device=device)
        self.live = torch.zeros(batch, dtype=torch.long, device=device)
        # seconds spent inside this cache's model forwards (the engine's step minus these is its work
        # outside them: what a cost profile's step_ms holds); ``sync``: wait for the device around
        # each forward so a GPU's time lands in it (a cost profile's steps; not a collection's)
        self.forward_s = 0.0
        self.sync = False

    def forward(self, ids: torch.Tensor, new_mask: torch.Tensor, hidden: bool = False, **extra):
        """Append ``ids`` ``[B, T]`` (``new_mask`` marks real slots); return logits [B, T, V].
        ``extra`` goes to the model (a hidden-state head's ``features``)."""
        pos = self.live[:, None] + (new_mask.cumsum(1) - 1).clamp(min=0)
        self.mask = torch.cat([self.mask, new_mask], 1)
        self.last_width = ids.shape[1]
        if self.sync:
            sync_device(ids.device)
        t0 = time.perf_counter()
        out = self.run(
            input_ids=ids,
            attention_mask=self.mask,
            position_ids=pos,
            **{self.cache_key: self.cache},
            use_cache=True,
            output_hidden_states=hidden,
            **extra,
        )
        if self.sync:
            sync_device(ids.device)
        self.forward_s += time.perf_counter() - t0
        self.live = self.live + new_mask.sum(1)
        return out

    def clone(self) -> _Cache:
        """A copy with its own cache, mask and live counts (the same model): decoding it leaves
        this one as it was."""
        import copy

        from svt.collect.kv_cache import GrowingLayer

        new = copy.copy(self)
        new.cache = copy.deepcopy(self.cache)
        for layer in new.cache.layers:
            if isinstance(layer, GrowingLayer) and getattr(layer, "_kbuf", None) is not None:
                layer._set_views()
        new.mask, new.live, new.forward_s = self.mask.clone(), self.live.clone(), 0.0
        return new

    def restrict_last(self, keep_mask: torch.Tensor) -> None:
        """Mask out, among the last ``keep_mask.shape[1]`` slots, those where ``keep_mask`` is 0."""
        n_new = keep_mask.shape[1]
        old = self.mask[:, -n_new:]
        kept = keep_mask.long() * old
        self.live = self.live - old.sum(1) + kept.sum(1)
        self.mask[:, -n_new:] = kept

    def compact(self) -> bool:
        """Drop the hole slots when there are many: at least ``COMPACT_MIN_HOLES`` slots that every
        row masks and at least ``COMPACT_SHARE`` of them all. Each row's live slots keep their order and move to the
        right end (left padding, as after the prefill); RoPE was applied when the keys were written
        and ``position_ids`` count live tokens, so the model sees the same tokens at the same
        positions: only the masked slots are gone, which attention gave zero weight. Returns whether
        it compacted (never for caches with layers that cannot gather, e.g. sliding windows)."""
        from svt.collect.kv_cache import GrowingLayer

        width = self.mask.shape[1]
        if not self.mask.numel():
            return False
        n_live = self.mask.sum(1)
        keep = int(n_live.max())
        holes = width - keep
        if holes < COMPACT_MIN_HOLES or holes < COMPACT_SHARE * width:
            return False
        if not all(isinstance(layer, GrowingLayer) for layer in self.cache.layers):
            return False
        # a stable sort of the 0/1 mask puts each row's live slots last, in their order
        index = torch.argsort(self.mask, dim=1, stable=True)[:, width - keep :]
        for layer in self.cache.layers:
            layer.compact(index)
        ar = torch.arange(keep, device=self.mask.device)[None, :]
        self.mask = (ar >= (keep - n_live)[:, None]).long()
        return True

    def select(self, rows: torch.Tensor) -> None:
        """Keep only ``rows`` of the batch (finished requests leave)."""
        self.cache.batch_select_indices(rows)
        self.mask = self.mask.index_select(0, rows)
        self.live = self.live.index_select(0, rows)

    def merge(self, other: _Cache, keep: torch.Tensor | None = None) -> None:
        """Append ``other``'s rows (requests just prefilled) below this batch's rows ``keep`` (all when
        None): the narrower of the two is left-padded with masked slots to the wider width (as after
        a prefill), so every row keeps its slots, its live count and so its RoPE positions."""
        from svt.collect.kv_cache import merge_caches

        mask, live = self.mask, self.live
        if keep is not None:
            mask, live = mask.index_select(0, keep), live.index_select(0, keep)
        width = max(mask.shape[1], other.mask.shape[1])
        merge_caches(self.cache, other.cache, (width - mask.shape[1], width - other.mask.shape[1]),
                     (mask.shape[0], other.mask.shape[0]), keep)
        pad = torch.nn.functional.pad
        self.mask = torch.cat([pad(mask, (width - mask.shape[1], 0)),
                               pad(other.mask, (width - other.mask.shape[1], 0))], 0)
        self.live = torch.cat([live, other.live])


def sync_device(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class _Rows:
    """The state of the rows decoding between steps (tensors on the device, one entry per row still
    decoding; ``active`` holds each row's index in the list of prompts)."""

    tc: _Cache  # the target's cache
    dc: _Cache  # the draft's cache
    pending: torch.Tensor  # y: emitted last step, in neither cache yet
    unseen: torch.Tensor  # x_{K-1} of the last step when all K were accepted (the draft never saw it)
    has_unseen: torch.Tensor
    active: torch.Tensor
    # a hidden-state head's next catch-up slots (svt.collect.head_draft); None for a draft model
    catch: object = None
    # rows finished whose leaving waits for the next admission (``end_step(defer=True)``): a bool per row
    gone: np.ndarray | None = None

    def clone(self, use_draft: bool = True) -> _Rows:
        """A copy to decode from (a cost profile times several K on one prefill); ``use_draft=False``
        leaves the drafter's cache empty, as ``prefill_rows(..., use_draft=False)`` does."""
        B, device = self.active.numel(), self.active.device
        if use_draft:
            dc, catch = self.dc.clone(), None if self.catch is None else self.catch.select(torch.arange(B, device=device))
        else:
            dc, catch = _Cache(self.dc.model, B, device), None
            dc.mask = torch.zeros((B, 0), dtype=torch.long, device=device)
        return _Rows(self.tc.clone(), dc, self.pending.clone(), self.unseen.clone(), self.has_unseen.clone(),
                     self.active.clone(), catch)

    def end_step(self, done: np.ndarray, device, compact: bool, defer: bool = False) -> None:
        """Finished rows leave; then both caches compact if their holes are many. ``defer``: requests
        are waiting to take the finished rows' slots, so the rows leave in the same copy of the caches
        that admits them (:meth:`merge`), not in one of their own now (an index_select of every layer's
        whole cache, once per finishing request, was most of a continuous run's work outside its
        forwards at batch 8 and 16); the caches compact as on any step, the finished rows' slots
        still among the rows'."""
        if done.any() and defer:
            self.gone = done if self.gone is None else self.gone | done
        elif done.any():
            self.drop(done, device)
        if compact:
            self.tc.compact()
            self.dc.compact()

    def live_rows(self) -> int:
        """The rows still decoding (the batch's rows less those finished and waiting to leave)."""
        return self.active.numel() - (0 if self.gone is None else int(self.gone.sum()))

    def leave(self, device) -> None:
        """The finished rows whose leaving was deferred leave now, in copies of their own."""
        if self.gone is not None:
            gone, self.gone = self.gone, None
            self.drop(gone, device)

    def drop(self, done: np.ndarray, device) -> None:
        """Finished rows leave the batch (and both caches)."""
        keep = self._keep_rows(done, device)
        self.tc.select(keep)
        self.dc.select(keep)

    def _keep_rows(self, done: np.ndarray, device) -> torch.Tensor:
        """The per-row state of the rows not ``done`` (the caches are the caller's); their indices."""
        keep = torch.from_numpy(np.flatnonzero(~done)).to(device)
        self.active = self.active.index_select(0, keep)
        self.pending, self.unseen, self.has_unseen = self.pending[keep], self.unseen[keep], self.has_unseen[keep]
        if self.catch is not None:
            self.catch = self.catch.select(keep)
        return keep

    def merge(self, new: _Rows) -> None:
        """Rows just prefilled join the batch (continuous batching), below the rows decoding; rows
        finished and waiting to leave (``gone``) leave in the same copy of each cache: the batch is
        the rows kept, in their order, then the new ones, as a drop then a merge would leave it."""
        from svt.collect.head_draft import merge_catch_up

        keep = None
        if self.gone is not None:
            keep, self.gone = self._keep_rows(self.gone, self.active.device), None
        self.tc.merge(new.tc, keep)
        self.dc.merge(new.dc, keep)
        self.pending = torch.cat([self.pending, new.pending])
        self.unseen = torch.cat([self.unseen, new.unseen])
        self.has_unseen = torch.cat([self.has_unseen, new.has_unseen])
        self.active = torch.cat([self.active, new.active])
        if self.catch is not None:
            self.catch = merge_catch_up(self.catch, new.catch)


def prefill_rows(target, draft, prompts: list[list[int]], pad_id: int, device, first: int = 0,
             use_draft: bool = True) -> _Rows:
    """Prefill both models with prompt[:-1] (left-padded); prompt[-1] is each row's pending token.
    ``first``: the index of ``prompts[0]`` among all the run's prompts; ``use_draft=False`` (plain
    decoding, K = 0) leaves the drafter's cache empty."""
    B = len(prompts)
    width = max(len(p) for p in prompts) - 1
    ids = torch.full((B, max(width, 1)), pad_id, dtype=torch.long)
    pmask = torch.zeros((B, max(width, 1)), dtype=torch.long)
    for b, p in enumerate(prompts):
        if len(p) > 1:
            ids[b, width - (len(p) - 1) :] = torch.tensor(p[:-1])
            pmask[b, width - (len(p) - 1) :] = 1
    ids, pmask = ids.to(device), pmask.to(device)
    tc, dc = _Cache(target, B, device), _Cache(draft, B, device)
    pending = torch.tensor([p[-1] for p in prompts], dtype=torch.long, device=device)
    head = is_head(draft)
    out = tc.forward(ids, pmask, hidden=head and use_draft)
    catch = None
    if not use_draft:
        dc.mask = torch.zeros((B, 0), dtype=torch.long, device=device)
    elif head:  # the head's prompt slots go into its cache now; the last waits for the first draft
        catch = prefill_head(dc, prefill_catch_up(draft, ids, pmask, taps_of(out, draft.cfg.aux_layer_ids), pending))
    else:
        dc.forward(ids, pmask)
    return _Rows(tc, dc, pending=pending,
                 unseen=torch.full((B,), pad_id, dtype=torch.long, device=device),
                 has_unseen=torch.zeros(B, dtype=torch.long, device=device),
                 active=torch.arange(first, first + B, device=device), catch=catch)


def _draft_k(rows: _Rows, params: SamplingParams, generator, hidden: bool, go_on=None):
    """Up to K draft tokens for every row: ``q`` [nb, L, V], ``x`` [nb, L], the last hidden
    states and the drafter's own confidence in each draft [nb, L] (a DSpark confidence head; else
    None). ``go_on(i, q_i) -> bool`` (AV+length) is asked after each draft whether another pass is
    needed (L < K when no row drafts on); without it L = K."""
    nb, K = rows.active.numel(), params.k
    if K == 0:  # plain decoding
        return None, torch.zeros((nb, 0), dtype=torch.long, device=rows.pending.device), [], None
    if rows.catch is not None:
        def sample(logits):
            q = process_probs(logits, params.temperature, params.top_p)
            return q, draft_token(q, params.greedy, generator)

        if is_block(rows.dc.model):  # one forward drafts the block (svt.collect.block_draft)
            return draft_with_block(rows.dc, rows.catch, rows.pending, K, sample, hidden, go_on)
        return (*draft_with_head(rows.dc, rows.catch, K, sample, hidden, go_on), None)
    ones1 = torch.ones((nb, 1), dtype=torch.long, device=rows.pending.device)
    feed = torch.stack([rows.unseen, rows.pending], 1)
    fmask = torch.stack([rows.has_unseen, torch.ones_like(rows.has_unseen)], 1)
    o = rows.dc.forward(feed, fmask, hidden=hidden)
    qs, toks, hid = [], [], []
    for i in range(K):
        q = process_probs(o.logits[:, -1], params.temperature, params.top_p)
        x = draft_token(q, params.greedy, generator)
        qs.append(q)
        toks.append(x)
        if hidden:
            hid.append(o.hidden_states[-1][:, -1])
        if i < K - 1 and (go_on is None or go_on(i, q)):
            o = rows.dc.forward(x[:, None], ones1, hidden=hidden)
        else:
            break
    return torch.stack(qs, 1), torch.stack(toks, 1), hid, None


def _advance_caches(rows: _Rows, x: torch.Tensor, acc: torch.Tensor, next_token: torch.Tensor, K: int,
                    pad_id: int, taps: torch.Tensor | None = None) -> None:
    """The target keeps y and the accepted drafts; the draft keeps what it was fed of them (a head:
    the verified slots' features wait for the next draft)."""
    W = rows.tc.last_width
    rows.tc.restrict_last(torch.arange(W, device=x.device)[None, :] < (acc + 1)[:, None])
    K = x.shape[1]  # drafted this step (fewer than the run's K when AV+length stopped every row early)
    kr = torch.arange(K + 1, device=x.device)[None, :]
    if K == 0:  # plain decoding: the drafter never runs
        rows.pending = next_token
        return
    if rows.catch is not None:
        rows.catch = step_catch_up(rows.dc.model, taps, x[:, : W - 1], acc, next_token)
        rows.pending = next_token
        return
    # draft's slots this step: [a, y, x_0 .. x_{K-2}]; keep a (when real), y, x_0..x_{acc-1}
    rows.dc.restrict_last((kr < 2) | (kr - 2 < acc[:, None]))
    all_acc = acc == K
    rows.unseen = torch.where(all_acc, x[:, K - 1], torch.full_like(rows.pending, pad_id))
    rows.has_unseen = all_acc.long()
    rows.pending = next_token


def _emit(out: BatchLog, n_out: np.ndarray, row_ids: np.ndarray, new_tok: np.ndarray, acc_np: np.ndarray, K: int,
          params: SamplingParams, eos_id: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Append each row's accepted run and next token to its output (cut at ``max_new_tokens`` and
    after ``eos_id``); return the tokens emitted and which rows finished."""
    nb = row_ids.size
    emitted = np.zeros(nb, dtype=np.int64)
    done = np.zeros(nb, dtype=bool)
    for j, r in enumerate(row_ids):  # per row, not per token
        toks_r = list(new_tok[j, : acc_np[j]]) + [int(new_tok[j, K])]
        toks_r = toks_r[: params.max_new_tokens - int(n_out[r])]
        if eos_id is not None and eos_id in toks_r:
            toks_r = toks_r[: toks_r.index(eos_id) + 1]
            out.finish[r] = "stop"
            done[j] = True
        out.outputs[r].extend(int(t) for t in toks_r)
        n_out[r] += len(toks_r)
        emitted[j] = len(toks_r)
        if n_out[r] >= params.max_new_tokens:
            done[j] = True
    return emitted, done


@torch.inference_mode()
def run_batch(
    target,
    draft,
    prompts: list[list[int]],
    params: SamplingParams,
    *,
    eos_id: int | None,
    pad_id: int,
    generator: torch.Generator,
    log: LogOptions | None = None,
    request_ids: list[int] | None = None,
    on_step=None,
    av: LiveAV | None = None,
    compact: bool = True,
    slots: int | None = None,
    on_finish=None,
    first_tick: int = 0,
    sync_forwards: bool = False,
    start: _Rows | None = None,
) -> BatchLog:
    """Speculative sampling for a list of prompts until every request has finished; log everything.

    ``prompts`` are token-id lists (non-empty). Rows finish at ``max_new_tokens`` or after emitting
    ``eos_id``; finished rows leave the batch. ``on_step(n_rows)`` is called after every step.
    ``compact`` drops the slots of rejected drafts and padding from both caches once they are many
    (``_Cache.compact``): attention then reads live slots, not holes.

    ``slots=None`` runs one static batch: every prompt is prefilled at once and the batch drains as
    its rows finish. ``slots=B`` is continuous batching, as vLLM and SGLang schedule: at most B
    requests decode at once and, before each step, the next prompts in order are prefilled into the
    slots that rows finishing at the last step freed, so B rows decode while requests wait.
    ``on_finish(indices, log)`` is told the prompts (indices into ``prompts``) that finished at a step
    (it may ``log.take`` their rows: the time it takes is outside every step's).
    ``params.k == 0`` is plain decoding through the same engine (the drafter never runs). Steps are
    numbered from ``first_tick``: under continuous batching a request's steps are the engine's ticks
    it decoded in (so ``step`` orders every request's steps in time). Each step's ``forward_ms`` is the
    time inside its model forwards; ``sync_forwards`` waits for the device around each (a GPU's
    forwards are otherwise queued, not run, when the clock reads: a cost profile's steps set it).
    ``start``: every prompt already prefilled (``prefill_rows``, or a ``_Rows.clone`` of it), for one
    static batch (``slots=None``); the run decodes from it, its first step's prefill time is 0.

    Long because one step's timed phases (admission, draft, verify, acceptance) and its order of
    random draws, which resumed and static runs reproduce bit for bit, read best in one place.
    """
    log = log or LogOptions()
    device = next(target.parameters()).device
    N, K, greedy = len(prompts), params.k, params.greedy
    if start is not None and (slots is not None or start.active.numel() != N):
        raise ValueError(f"Expected `start` to hold all {N} prompts of one static batch, but it holds "
                         f"{start.active.numel()} (slots={slots}).")
    if av is not None and av.length and av.lengths is None:
        from svt.collect.draft_length import LengthPolicy

        av.lengths = LengthPolicy(av)
    head = is_head(draft) and K > 0
    request_ids = request_ids if request_ids is not None else list(range(N))
    out = BatchLog(outputs=[[] for _ in range(N)], finish=["length"] * N)
    n_out = np.zeros(N, dtype=np.int64)
    width = N if slots is None else max(1, min(slots, N))
    admitted = 0
    rows: _Rows | None = None
    tick = first_tick
    while admitted < N or (rows is not None and rows.active.numel()):
        sync_device(device)
        t_in = time.perf_counter()
        n_new = min(width - (0 if rows is None else rows.live_rows()), N - admitted)
        if n_new <= 0 and rows is not None:
            rows.leave(device)
        if n_new > 0:  # prefill the next prompts into the free slots
            new = start if start is not None else prefill_rows(target, draft, prompts[admitted : admitted + n_new],
                                                               pad_id, device, admitted, K > 0)
            if rows is None or not rows.live_rows():
                rows = new
            else:
                _merge(rows, new)
            admitted += n_new
        rows.tc.sync = rows.dc.sync = sync_forwards
        f0 = rows.tc.forward_s + rows.dc.forward_s
        sync_device(device)
        t0 = time.perf_counter()
        nb = rows.active.numel()
        row_ids = rows.active.cpu().numpy()
        stopper = None if av is None or av.lengths is None else av.lengths.start(nb, K)
        q, x, hid, conf = _draft_k(rows, params, generator, log.hidden, None if stopper is None else stopper.go_on)
        sync_device(device)
        t1 = time.perf_counter()
        kept = torch.full((nb,), K, dtype=torch.long, device=device)
        drafted = None if stopper is None else torch.from_numpy(stopper.lengths).to(device)
        explored, stats = True, None
        if av is not None:  # the budget is decided on q alone, before the target runs
            stats = q_stats(q) if stopper is None else stopper.step_stats(q)  # logged too, not recomputed
            kept, explored = _live_av(av, stats, nb, K, generator, drafted, conf)
        # verify with one target forward over [y, x_0, ..., x_{kept-1}] (p_0..p_kept), each row's
        # trimmed drafts never computed: rows padded (masked) to the longest kept row
        W = x.shape[1] + 1 if av is None else int(kept.max()) + 1
        fmask = (torch.arange(W, device=device)[None, :] <= kept[:, None]).long()
        to = rows.tc.forward(torch.cat([rows.pending[:, None], x[:, : W - 1]], 1), fmask, hidden=head)
        verify_slots = rows.tc.mask.shape[1]  # the cache width its attention read, padding and holes included
        p = process_probs(to.logits, params.temperature, params.top_p)  # [nb, W, V]
        label_ok = None
        if stopper is not None:
            stopper.observe(q)  # what this step shows the next: how many rows went on past each position
        if W == 1:  # plain decoding, or every row's drafts trimmed: the target's own sample
            acc = torch.zeros(nb, dtype=torch.long, device=device)
            next_token = draft_token(p[:, 0], greedy, generator)
            label_ok = torch.zeros((nb, 0), dtype=torch.bool, device=device)
        else:
            res = verify(p, q[:, : W - 1], x[:, : W - 1], greedy=greedy, generator=generator)
            acc, next_token, label_ok = res.accepted, res.next_token, res.label_ok
            if av is not None:
                acc, next_token = trim(p, acc, next_token, kept, greedy=greedy, generator=generator)
        sync_device(device)
        t2 = time.perf_counter()
        _advance_caches(rows, x, acc, next_token, K, pad_id,
                        taps_of(to, draft.cfg.aux_layer_ids) if head else None)
        emitted, done = _log_step(out, n_out, rows, row_ids, [request_ids[r] for r in row_ids], tick, params,
                                  (q, p, x, hid, label_ok, acc, kept, drafted, conf, stats), eos_id=eos_id, log=log, av=av,
                                  generator=generator, times=((t1 - t0) * 1e3, (t2 - t1) * 1e3), explored=explored)
        rows.end_step(done, device, compact, defer=slots is not None and admitted < N)
        sync_device(device)
        t3 = time.perf_counter()
        out.add(out.schedule, tick=np.array([tick], np.int32), batch_size=np.array([nb], np.int16),
                admitted=np.array([max(n_new, 0)], np.int16), prefill_ms=np.array([(t0 - t_in) * 1e3], np.float32),
                draft_ms=np.array([(t1 - t0) * 1e3], np.float32), verify_ms=np.array([(t2 - t1) * 1e3], np.float32),
                step_ms=np.array([(t3 - t0) * 1e3], np.float32),
                forward_ms=np.array([(rows.tc.forward_s + rows.dc.forward_s - f0) * 1e3], np.float32), draft_passes=np.array([x.shape[1]], np.int16),
                verify_tokens=np.array([int(fmask.numel())], np.int32),
                verify_slots=np.array([verify_slots], np.int32),
                emitted=np.array([int(emitted.sum())], np.int32))
        tick += 1
        if on_step is not None:
            on_step(nb)
        if on_finish is not None and done.any():
            on_finish([int(r) for r in row_ids[done]], out)
    return out


def _log_step(out: BatchLog, n_out, rows: _Rows, row_ids, req_ids, tick: int, params: SamplingParams, step,
              *, eos_id, log: LogOptions, av, generator, times, explored) -> tuple[np.ndarray, np.ndarray]:
    """Emit one step's tokens and log its rows (two device-to-host transfers); returns the tokens
    each row emitted and which rows finished. A row's drafts are logged up to its drafted length
    (AV+length: ``drafted``; else every drafted position)."""
    q, p, x, hid, label_ok, acc, kept, drafted, conf, stats = step
    L, nb = x.shape[1], row_ids.size
    ar = torch.arange(L, device=x.device)[None, :]
    verified = ar < kept[:, None]  # trimmed drafts carry no label (null)
    label = torch.where(ar < acc[:, None], 1, torch.where((ar == acc[:, None]) & verified, 0, -1))
    lengths = torch.full_like(kept, L) if drafted is None else drafted
    ints = torch.cat([x, rows.pending[:, None], label, acc[:, None], kept[:, None], lengths[:, None]], 1).cpu().numpy()
    new_tok, label_np = ints[:, : L + 1], ints[:, L + 1 : 2 * L + 1]
    acc_np, kept_np, len_np = ints[:, -3], ints[:, -2], ints[:, -1]
    if av is not None and av.observe is not None:
        av.observe(_full_labels(label_np, params.k))
    emitted, done = _emit(out, n_out, row_ids, new_tok, acc_np, L, params, eos_id)
    req = np.asarray(req_ids, dtype=np.int64)
    if L > 0:
        nan = float("nan")
        pk = torch.cat([p[:, : p.shape[1] - 1], p.new_full((nb, L + 1 - p.shape[1], p.shape[2]), nan)], 1)
        feats = draft_features(q, pk, x, stats)
        if params.greedy:  # acceptance is argmax agreement: the soft labels are the 0/1 outcome
            ok = torch.cat([label_ok.float(), label_ok.new_zeros((nb, L - label_ok.shape[1])).float()], 1)
            feats["accept_prob"] = ok
            feats["accept_prob_expected"] = ok
        for col in P_COLUMNS:  # a trimmed draft's target distribution was never computed: null
            feats[col] = torch.where(verified, feats[col], nan)
        if conf is not None:  # the drafter's confidence head, computed when it drafted
            feats["confidence"] = conf.to(feats["q_max"].dtype)
        floats = torch.stack(list(feats.values())).float().cpu().numpy()  # [n_feats, nb, L]
        proposed = np.arange(L)[None, :] < len_np[:, None]
        _log_drafts(out, req, tick, L, new_tok, label_np, feats, floats, proposed)
        if log.hidden:
            h = torch.stack(hid, 1).to(torch.float16).cpu().numpy()
            out.hidden.append(h[proposed])
        if log.dists_fraction > 0:
            _log_dists(out, q, pk, x, req, tick, log, generator, verified)
    _log_steps(out, req, tick, len_np, acc_np, kept_np, emitted, times[0], times[1], explored)
    return emitted, done


def _full_labels(label_np: np.ndarray, K: int) -> np.ndarray:
    """A step's labels widened to the run's K (-1: not drafted), as an online estimator reads them."""
    if label_np.shape[1] == K:
        return label_np
    return np.concatenate([label_np, np.full((label_np.shape[0], K - label_np.shape[1]), -1, label_np.dtype)], 1)


def _merge(rows: _Rows, new: _Rows) -> None:
    from svt.collect.kv_cache import MergeError
    from svt.errors import ConfigError

    try:
        rows.merge(new)
    except MergeError as exc:
        raise ConfigError(f"Continuous batching cannot join this model's caches ({exc}): collect with "
                          "`schedule: static`.") from None


def _log_drafts(out: BatchLog, req, step_no: int, K: int, new_tok, label_np, feats, floats, proposed) -> None:
    """One step's rows of the drafts table: each row's proposed drafts (``proposed`` [nb, K])."""
    nb = req.size
    m = proposed.reshape(-1)
    out.add(
        out.drafts,
        request=np.repeat(req, K)[m],
        step=np.full(int(m.sum()), step_no, dtype=np.int32),
        position=np.tile(np.arange(K, dtype=np.int16), nb)[m],
        token=new_tok[:, :K].reshape(-1)[m],
        label=label_np.reshape(-1)[m],
        **{k: floats[i].reshape(-1)[m] for i, k in enumerate(feats)},
    )


def _log_steps(out: BatchLog, req, step_no: int, drafted, acc_np, kept_np, emitted, draft_ms: float,
               verify_ms: float, explored: bool) -> None:
    """One step's rows of the steps table (``drafted``: each row's drafts, or one count for all)."""
    nb = req.size
    out.add(
        out.steps,
        request=req,
        step=np.full(nb, step_no, dtype=np.int32),
        drafted=np.broadcast_to(np.asarray(drafted, dtype=np.int16), (nb,)).copy(),
        accepted=acc_np.astype(np.int16),
        emitted=emitted.astype(np.int16),
        draft_ms=np.full(nb, draft_ms, dtype=np.float32),
        verify_ms=np.full(nb, verify_ms, dtype=np.float32),
        batch_size=np.full(nb, nb, dtype=np.int16),
        kept=kept_np.astype(np.int16),
        explored=np.full(nb, explored, dtype=bool),
    )


def _live_av(av: LiveAV, stats: dict[str, torch.Tensor], nb: int, K: int, generator, drafted=None,
             head_conf=None) -> tuple[torch.Tensor, bool]:
    """Drafts kept per row by the AV budget rule (all those drafted on an exploration step), scored
    on ``stats`` (``q_stats`` of the step's drafts, [nb, L] each).
    ``drafted`` [nb]: AV+length's lengths (None: K each); the budget chooses among them, their
    confidences 0 past each row's length, as the replay's AV+length does. ``head_conf`` [nb, L]: the
    drafter's confidence head (the ``confidence`` feature's column), when it has one."""
    from svt.simulate.av import av_keep

    L, device = stats["q_max"].shape[1], stats["q_max"].device
    explore = av.explore > 0 and float(torch.rand((), generator=generator, device=device)) < av.explore
    feats = {k: v.float().cpu().numpy() for k, v in stats.items()}
    if head_conf is not None:
        feats["confidence"] = head_conf.float().cpu().numpy()
    # always scored, so an online estimator sees the confidences in force at drafting time
    conf = np.asarray(av.confidence(feats, np.tile(np.arange(L), (nb, 1))), dtype=np.float64)
    lengths = np.full(nb, K) if drafted is None else drafted.cpu().numpy()
    if explore or (av.warming_up is not None and av.warming_up()):
        return torch.from_numpy(np.minimum(lengths, L)).to(device), True
    if drafted is None:
        return torch.from_numpy(av_keep(conf, av.costs, av.rule)).to(device), False
    full = np.zeros((nb, K))
    full[:, :L] = np.where(np.arange(L)[None, :] < lengths[:, None], conf, 0.0)
    kept = np.minimum(av_keep(full, av.costs, av.rule), lengths)
    return torch.from_numpy(kept).to(device), False


def _log_dists(out: BatchLog, q, p, x, req, step_no, log: LogOptions, generator, verified) -> None:
    """Top-k of q and p (plus tail mass) for a random fraction of this step's verified draft positions."""
    nb, K, V = q.shape
    pick = (torch.rand((nb, K), generator=generator, device=q.device) < log.dists_fraction) & verified
    idx = pick.nonzero()
    if idx.numel() == 0:
        return
    k = min(log.dists_top_k, V)
    qs, ps = q[idx[:, 0], idx[:, 1]], p[idx[:, 0], idx[:, 1]]
    qv, qi = qs.topk(k, -1)
    pv, pi = ps.topk(k, -1)
    idx_np = idx.cpu().numpy()
    out.add(
        out.dists,
        request=req[idx_np[:, 0]],
        step=np.full(len(idx_np), step_no, dtype=np.int32),
        position=idx_np[:, 1].astype(np.int16),
        token=x[idx[:, 0], idx[:, 1]].cpu().numpy(),
        q_top_ids=qi.cpu().numpy(),
        q_top_probs=qv.cpu().numpy(),
        q_tail=(1 - qv.sum(-1)).clamp(0, 1).cpu().numpy(),
        p_top_ids=pi.cpu().numpy(),
        p_top_probs=pv.cpu().numpy(),
        p_tail=(1 - pv.sum(-1)).clamp(0, 1).cpu().numpy(),
    )
