"""The recorder: pairs each proposal with its verification and spools rows to disk.

Nothing here touches vLLM: the hooks in :mod:`.internals` hand it plain arrays, so its logic is
tested without an engine. A proposal is kept per request until the next verification of that
request; the verification is recorded only when its draft tokens are the proposal's (a mismatch is
counted, never logged as data).

Spool layout (one folder per process, so processes never share a file)::

    SPOOL/spool/<host>-<pid>/process.json          engine facts (vLLM version, models, K)
    SPOOL/spool/<host>-<pid>/NNNNN-<table>.parquet  one flush: drafts, steps, requests, ids
    SPOOL/spool/<host>-<pid>/NNNNN.done             written last: the flush is whole

Every file is written to a temporary name and renamed; a flush without its ``.done`` marker (the
process died while writing it) is ignored by :func:`svt.vllm_plugin.finish.finish_spool`.
"""

from __future__ import annotations

import atexit
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from svt.fileio import atomic_path, json_text, write_text_atomic
from svt.vllm_plugin.state import active, set_active

FLUSH_ROWS_ENV = "SVT_TRACE_FLUSH_ROWS"
WORKLOAD_ENV = "SVT_WORKLOAD"
PLACEHOLDER = -1  # vLLM's id for positions after a rejection in the sampler's output

SPOOL_SCHEMAS = {
    "drafts": {"vllm_request": pl.String, "step": pl.Int32, "position": pl.Int16, "token": pl.Int32,
               "q_max": pl.Float32, "q_margin": pl.Float32, "q_entropy": pl.Float32, "q_sampled": pl.Float32,
               "p_sampled": pl.Float32, "p_max": pl.Float32, "accept_prob": pl.Float32,
               "accept_prob_expected": pl.Float32, "label": pl.Int8},
    "steps": {"vllm_request": pl.String, "step": pl.Int32, "drafted": pl.Int16, "accepted": pl.Int16,
              "emitted": pl.Int16, "draft_ms": pl.Float32, "verify_ms": pl.Float32, "batch_size": pl.Int16,
              "kept": pl.Int16, "explored": pl.Boolean},
    "requests": {"vllm_request": pl.String, "prompt_ids": pl.List(pl.Int32), "output_ids": pl.List(pl.Int32),
                 "finish_reason": pl.String, "temperature": pl.Float32, "top_p": pl.Float32},
    "ids": {"external": pl.String, "internal": pl.String},
    # the engine's own SuffixDecoding proposals (vLLM's `suffix` method), one per request and step
    "cache": {"vllm_request": pl.String, "decode_pos": pl.Int32, "context_len": pl.Int32,
              "draft_ids": pl.List(pl.Int32), "probs": pl.List(pl.Float32), "score": pl.Float32,
              "match_len": pl.Int16, "from_global": pl.Boolean, "lookup_ms": pl.Float32},
}


@dataclass
class Proposal:
    ids: np.ndarray  # [k] int32 draft tokens
    q: np.ndarray  # [k, 4] float32: q_max, q_margin, q_entropy, q_sampled
    draft_ms: float
    finite: np.ndarray  # [k] bool: every statistic of the draft is finite


def _atomic_write(frame: pl.DataFrame, path: Path) -> None:
    with atomic_path(path) as tmp:
        frame.write_parquet(tmp, compression="zstd")


class Recorder:
    """Collects the rows of one process and spools them in flushes of about ``flush_rows`` drafts."""

    def __init__(self, trace_dir: str | Path, flush_rows: int | None = None, name: str | None = None):
        self.dir = Path(trace_dir) / "spool" / (name or f"{socket.gethostname()}-{os.getpid()}")
        self.dir.mkdir(parents=True, exist_ok=True)
        self.flush_rows = flush_rows or int(os.environ.get(FLUSH_ROWS_ENV, 1 << 16))
        self.workload = os.environ.get(WORKLOAD_ENV, "vllm")
        self.pending: dict[str, Proposal] = {}
        self.step_of: dict[str, int] = {}
        self.counters = {"verified_drafts": 0, "mismatched_drafts": 0, "unmatched_drafts": 0,
                         "nonfinite_drafts": 0, "unrecorded_proposals": 0}
        self.flushes = 0
        self.facts: dict = {}
        self.notes: dict = {"expand_fix": False}  # what the hooks did besides recording
        self._reset()
        # every process says who it is at once; only a model runner's adds the engine facts (K,
        # models), so finish_spool tells an API server's or scheduler's folder from an empty runner
        _write_json(self.dir / "process.json", {"pid": os.getpid(), "host": socket.gethostname(),
                                                 "workload": self.workload})

    def _reset(self) -> None:
        self.drafts: list[dict[str, np.ndarray]] = []
        self.steps: list[dict] = []
        self.requests: list[dict] = []
        self.ids: list[tuple[str, str]] = []
        self.cache: list[tuple] = []
        self.rows = 0

    # -- events (called by the hooks) ---------------------------------------------------------

    def describe(self, **facts) -> None:
        """Engine facts (vLLM version, models, K, methods) written to ``process.json``."""
        self.facts.update(facts)
        self.facts.setdefault("workload", self.workload)
        _write_json(self.dir / "process.json", {"pid": os.getpid(), "host": socket.gethostname(), **self.facts})

    def named(self, external: str, internal: str) -> None:
        """The engine renamed a request (vLLM appends a random suffix to the caller's id)."""
        self.ids.append((external, internal))

    def proposed(self, req_ids: list[str], draft_ids: np.ndarray, q: np.ndarray, draft_ms: float) -> None:
        """``draft_ids`` ``[B, K]`` and their q statistics ``[B, K, 4]`` for the batch ``req_ids``."""
        draft_ids = draft_ids.astype(np.int32, copy=False)
        q = q.astype(np.float32, copy=False)
        finite = np.isfinite(q).all(axis=2)
        for i, r in enumerate(req_ids):
            if r is None:
                continue
            self.pending[r] = Proposal(draft_ids[i], q[i], draft_ms, finite[i])

    def verified(self, req_ids: list[str], num_draft: list[int], draft_ids: np.ndarray, p: np.ndarray,
                 sampled: np.ndarray, verify_ms: float) -> None:
        """One verification: ``num_draft[i]`` drafts of request ``req_ids[i]``, flattened in
        ``draft_ids`` and their p statistics ``p`` ``[sum(num_draft), 4]``; ``sampled`` ``[B, K+1]``
        is the rejection sampler's output (PLACEHOLDER after the first rejection)."""
        batch = sum(1 for n in num_draft if n > 0)
        emitted_all = (sampled != PLACEHOLDER).sum(axis=1)
        finite_p = np.isfinite(p).all(axis=1)
        good, props, lows = [], [], []
        off = 0
        for i, (r, n) in enumerate(zip(req_ids, num_draft, strict=True)):
            lo, off = off, off + n
            if n == 0:
                continue
            prop = self.pending.pop(r, None)
            if prop is None:
                self.counters["unmatched_drafts"] += n
                continue
            if n > len(prop.ids) or not np.array_equal(prop.ids[:n], draft_ids[lo:off]):
                self.counters["mismatched_drafts"] += n
                continue
            if not 1 <= emitted_all[i] <= n + 1:
                self.counters["mismatched_drafts"] += n
                continue
            if not (finite_p[lo:off].all() and prop.finite[:n].all()):
                self.counters["nonfinite_drafts"] += n  # finish_spool refuses such a spool
                continue
            good.append(i)
            props.append(prop)
            lows.append(lo)
        if not good:
            return
        ns = np.array([num_draft[i] for i in good])
        accepted = emitted_all[good] - 1
        steps = np.array([self.step_of.get(req_ids[i], 0) for i in good], dtype=np.int32)
        for i, st in zip(good, steps, strict=True):
            self.step_of[req_ids[i]] = int(st) + 1
        total = int(ns.sum())
        pos = np.arange(total) - np.repeat(np.cumsum(ns) - ns, ns)
        acc = np.repeat(accepted, ns)
        label = np.where(pos < acc, 1, np.where(pos == acc, 0, -1)).astype(np.int8)
        rows = np.concatenate([np.arange(lo, lo + n) for lo, n in zip(lows, ns, strict=True)])
        self.drafts.append({"vllm_request": np.repeat(np.array([req_ids[i] for i in good], dtype=object), ns),
                            "step": np.repeat(steps, ns), "position": pos.astype(np.int16),
                            "token": draft_ids[rows].astype(np.int32),
                            "q": np.concatenate([pr.q[:n] for pr, n in zip(props, ns, strict=True)]),
                            "p": p[rows], "label": label})
        for j, i in enumerate(good):
            pr = props[j]
            self.steps.append((req_ids[i], int(steps[j]), len(pr.ids), int(accepted[j]), int(accepted[j]) + 1,
                               pr.draft_ms, verify_ms, batch, int(ns[j]), int(ns[j]) == len(pr.ids)))
        self.rows += total
        self.counters["verified_drafts"] += total
        if self.rows >= self.flush_rows:
            self.flush()

    def cache_proposed(self, req_id: str, decode_pos: int, context_len: int, draft_ids: list[int],
                       probs: list[float], score: float, match_len: int, from_global: bool, lookup_ms: float) -> None:
        """The engine's suffix cache proposed ``draft_ids`` (maybe none) for ``req_id`` with
        ``decode_pos`` output tokens generated."""
        self.cache.append((req_id, decode_pos, context_len, draft_ids, probs, score, match_len, from_global,
                           lookup_ms))
        self.rows += 1
        if self.rows >= self.flush_rows:
            self.flush()

    def finished(self, req_id: str, prompt_ids, output_ids, reason: str, temperature: float, top_p: float) -> None:
        self.pending.pop(req_id, None)
        self.requests.append({"vllm_request": req_id, "prompt_ids": list(prompt_ids),
                              "output_ids": list(output_ids), "finish_reason": reason,
                              "temperature": temperature, "top_p": top_p})

    # -- spooling --------------------------------------------------------------------------------

    def flush(self) -> None:
        """Write what is buffered as one whole flush (its ``.done`` marker last)."""
        if not (self.drafts or self.steps or self.requests or self.ids or self.cache):
            return
        n = self.flushes
        frames = {"drafts": self._drafts_frame(), "steps": pl.DataFrame(self.steps, schema=SPOOL_SCHEMAS["steps"], orient="row"),
                  "requests": pl.DataFrame(self.requests, schema=SPOOL_SCHEMAS["requests"]),
                  "ids": pl.DataFrame(self.ids, schema=SPOOL_SCHEMAS["ids"], orient="row"),
                  "cache": pl.DataFrame(self.cache, schema=SPOOL_SCHEMAS["cache"], orient="row")}
        for table, frame in frames.items():
            _atomic_write(frame, self.dir / f"{n:05d}-{table}.parquet")
        _write_json(self.dir / f"{n:05d}.done", {"rows": {t: f.height for t, f in frames.items()},
                                                 "counters": dict(self.counters), "notes": dict(self.notes),
                                                 "time": time.time()})
        self.flushes += 1
        self._reset()

    def _drafts_frame(self) -> pl.DataFrame:
        schema = SPOOL_SCHEMAS["drafts"]
        if not self.drafts:
            return pl.DataFrame(schema=schema)
        cat = {k: np.concatenate([d[k] for d in self.drafts]) for k in self.drafts[0]}
        q, p = cat.pop("q"), cat.pop("p")
        cols = {"vllm_request": cat["vllm_request"].tolist(), "step": cat["step"], "position": cat["position"],
                "token": cat["token"]}
        for j, c in enumerate(("q_max", "q_margin", "q_entropy", "q_sampled")):
            cols[c] = q[:, j]
        for j, c in enumerate(("p_sampled", "p_max", "accept_prob", "accept_prob_expected")):
            cols[c] = p[:, j]
        frame = pl.DataFrame(cols)
        label = pl.Series("label", cat["label"]).cast(pl.Int8)
        frame = frame.with_columns(pl.when(label >= 0).then(label).otherwise(None).alias("label"))
        return frame.select([pl.col(c).cast(t) for c, t in schema.items()])


def _write_json(path: Path, obj) -> None:
    write_text_atomic(path, json_text(obj, default=str))


def activate(trace_dir: str | Path) -> Recorder:
    """Turn tracing on in this process (idempotent for one directory): check the vLLM version,
    install the hooks, flush at exit."""
    current = active()
    if current is not None:
        if Path(trace_dir).resolve() != current.dir.parent.parent.resolve():
            raise RuntimeError(f"svt: this process already traces into {current.dir.parent.parent}; one "
                               "trace directory per process.")
        return current
    from svt.vllm_plugin import (
        internals,  # only when tracing: an inert plugin loads none of vLLM's hooks
    )

    internals.check_version()
    # the hooks are in vLLM's V1 model runner; vLLM 0.32.0 picks its V2 runner on GPU builds unless told
    v2 = os.environ.get("VLLM_USE_V2_MODEL_RUNNER", "").strip().lower()
    if v2 in ("1", "true", "yes"):
        raise RuntimeError("svt's vLLM plugin records from vLLM's V1 model runner, but VLLM_USE_V2_MODEL_RUNNER "
                           "is set; unset it (tracing sets it to 0) or unset SVT_TRACE_DIR.")
    os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "0"
    rec = Recorder(trace_dir)
    internals.install()
    set_active(rec)
    atexit.register(rec.flush)
    return rec


def deactivate() -> None:
    """Flush and stop recording (the hooks stay installed and do nothing)."""
    if active() is not None:
        active().flush()
    set_active(None)
