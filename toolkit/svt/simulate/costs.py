"""Cost tables: how long drafting k tokens for a batch and verifying n tokens take.

Two kinds of file (YAML):

- ``kind: measured`` — ``draft_ms[batch][k]`` and ``verify_rows_ms[rows][tokens a row]`` written by
  ``svt collect --profile-costs`` (a monotone fit to timed repeats on a real pair and device,
  :mod:`svt.collect.cost_fit`), or a hand-written ``verify_ms[tokens]`` in total tokens alone
  (older tables; the rows of the forward are then not modelled);
- ``kind: roofline`` — a **model**, not a measurement: a forward pass over t tokens takes
  max(weight bytes / memory bandwidth, 2 * params * t / peak FLOP/s) + a fixed overhead, for the
  target and the drafter; the file names where its constants come from.

``drafter: autoregressive`` pays one drafter pass per draft token; ``parallel`` drafts all K in one
pass (the Adaptive Verification source, "Limitations").

A measured table may also carry ``step_ms[batch][k]``: the engine's work per step outside its two
forwards (sampling, acceptance, bookkeeping, cache compaction, admitting requests), timed on real
engine steps by ``--profile-costs``. ``draft(batch, k)`` charges it with the drafter's passes (k = 0,
plain decoding, pays it too), so every replay prices the whole step the engine runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from svt.errors import ConfigError


@dataclass
class CostTable:
    kind: str
    drafter: str = "autoregressive"
    description: str = ""
    draft_ms: dict[int, dict[int, float]] = field(default_factory=dict)  # measured: [batch][k]
    verify_ms: dict[int, float] = field(default_factory=dict)  # measured: [tokens]
    model: dict = field(default_factory=dict)  # roofline constants
    # how sure a measured table is (svt collect --profile-costs): repeats, spread, machine load,
    # the cores and threads, and ``warnings`` (non-empty: the figures may not be the machine's)
    measurement: dict = field(default_factory=dict)
    # measured tables: the models profiled (paths, and weights hashes when svt wrote the table)
    models: dict = field(default_factory=dict)
    # measured: [rows][tokens a row], the fitted surface (replaces verify_ms when present)
    verify_rows_ms: dict[int, dict[int, float]] = field(default_factory=dict)
    # measured: [batch][k], the engine's per-step work outside its forwards (empty: not charged)
    step_ms: dict[int, dict[int, float]] = field(default_factory=dict)

    def fingerprint(self) -> str:
        """SHA-256 (16 hex digits) of the numbers that define the table (not its description): two
        reports' replays are comparable only when their tables' fingerprints agree."""
        import hashlib
        import json

        body = {"kind": self.kind, "drafter": self.drafter, "model": self.model,
                "draft_ms": {str(b): {str(k): v for k, v in sorted(row.items())} for b, row in sorted(self.draft_ms.items())},
                "verify_ms": {str(t): v for t, v in sorted(self.verify_ms.items())}}
        if self.verify_rows_ms:
            body["verify_rows_ms"] = {str(b): {str(m): v for m, v in sorted(row.items())}
                                      for b, row in sorted(self.verify_rows_ms.items())}
        if self.step_ms:
            body["step_ms"] = {str(b): {str(k): v for k, v in sorted(row.items())} for b, row in sorted(self.step_ms.items())}
        reps = ((self.measurement or {}).get("fit") or {}).get("replicates")
        if reps:  # they price the ranges a report gives: two tables with other refits are other tables
            body["replicates"] = hashlib.sha256(json.dumps(reps, sort_keys=True, default=str).encode()).hexdigest()
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]

    def pair_problems(self, metas: list[dict]) -> list[str]:
        """Why this measured table does not time the runs' pair (``metas``: their run.json): a
        table svt profiled records its models' weights hashes; another target or draft is named."""
        weights = (self.models or {}).get("weights") or {}
        out = []
        for m in metas:
            for role in ("target", "draft"):
                a, b = weights.get(role), ((m.get("models") or {}).get(role) or {}).get("weights_sha256_16")
                if a and b and a != b:
                    out.append(f"it was profiled on another {role} (weights {a}) than the run's ({b})")
        return list(dict.fromkeys(out))

    def beyond(self, k: int, concurrency, requests: int) -> list[str]:
        """Where a chain replay reads a measured table beyond what it measured (extrapolated)."""
        if self.kind != "measured":
            return []
        b = min(max(concurrency), requests)  # a replay batches at most the run's requests
        out = self.verify_reach(b, b * (k + 1))
        if b > max(self.draft_ms):
            out.append(f"draft_ms up to batch {max(self.draft_ms)}, the replay needs {b}")
        if min(concurrency) < min(self.draft_ms):
            out.append(f"draft_ms from batch {min(self.draft_ms)}, the replay needs {min(concurrency)}")
        return out

    def verify_reach(self, rows: float, tokens: float) -> list[str]:
        """Where a verify of ``tokens`` over ``rows`` reads a measured table past what it measured."""
        if self.kind != "measured":
            return []
        if not self.verify_rows_ms:
            top = max(self.verify_ms)
            return [f"verify_ms up to {top} tokens, the replay needs {tokens:.0f}"] if tokens > top else []
        out = []
        widest = min(max(row) for row in self.verify_rows_ms.values())
        if tokens / max(rows, 1) > widest:
            out.append(f"verify_rows_ms up to {widest} tokens a row, the replay needs {tokens / max(rows, 1):.3g}")
        if rows > max(self.verify_rows_ms):
            out.append(f"verify_rows_ms up to {max(self.verify_rows_ms)} rows, the replay needs {rows:.0f}")
        return out

    def replicates(self) -> list[CostTable]:
        """The cost model's bootstrap refits (``measurement.fit.replicates``) as tables: a replay run
        on each gives the interval the fit's uncertainty puts on its figures (empty: none kept)."""
        out = []
        for rep in ((self.measurement or {}).get("fit") or {}).get("replicates") or []:
            out.append(CostTable("measured", self.drafter, draft_ms={int(b): {int(k): float(v) for k, v in row.items()}
                                                                     for b, row in rep["draft_ms"].items()},
                                 verify_rows_ms={int(b): {int(m): float(v) for m, v in row.items()}
                                                 for b, row in rep["verify_rows_ms"].items()},
                                 step_ms=self.step_ms))
        return out

    def _roofline(self, who: str, tokens) -> np.ndarray:
        m = self.model[who]
        t = np.asarray(tokens, dtype=np.float64)
        mem = m["weight_bytes"] / self.model["bandwidth_bytes_per_s"]
        compute = 2.0 * m["params"] * t / self.model["peak_flops"]
        return (np.maximum(mem, compute) + m["overhead_s"]) * 1e3

    def verify(self, tokens, rows=None) -> np.ndarray:
        """Milliseconds to verify ``tokens`` tokens over ``rows`` rows in one target forward
        (vectorised over ``tokens``). ``rows`` is needed by a fitted surface (``verify_rows_ms``);
        a roofline and a table in total tokens alone do not model it."""
        if isinstance(tokens, (int, np.integer)):  # the replays walk cycle by cycle: one count at a time
            cache = self.__dict__.setdefault("_verify_cache", {})
            key = (int(tokens), None if rows is None else float(rows))
            if key not in cache:
                cache[key] = self._verify(np.asarray(key[0], dtype=np.float64), rows)
            return cache[key]
        return self._verify(np.asarray(tokens, dtype=np.float64), rows)

    def _verify(self, t: np.ndarray, rows) -> np.ndarray:
        if self.kind == "roofline":
            return self._roofline("target", t)
        if self.verify_rows_ms:
            if rows is None:
                raise ValueError("this cost table's verify time depends on the rows of the forward: pass rows=")
            if "_surface" not in self.__dict__:
                from svt.simulate.surface import VerifySurface

                self._surface = VerifySurface(self.verify_rows_ms)
            return self._surface(t, rows)
        if "_verify_xy" not in self.__dict__:
            xs = np.array(sorted(self.verify_ms))
            # timing noise can make a measured table dip; more tokens never take less time
            self._verify_xy = (xs, np.maximum.accumulate(np.array([self.verify_ms[x] for x in xs])))
        return _interp(t, *self._verify_xy)

    def draft(self, batch: int, k: int) -> float:
        """Milliseconds of a step's work besides the verify forward: the drafter proposing ``k``
        tokens for ``batch`` requests, plus the engine's per-step work (``step_ms``) when the table
        measured it.

        Measured tables: an autoregressive drafter pays the measured ``draft_ms[batch][k]`` (k
        sequential passes); a parallel drafter pays one pass over ``batch * k`` tokens, read as the
        measured single-token pass of a batch of that many rows. Batch sizes between measured ones
        are interpolated linearly; beyond the largest, time scales in proportion to the batch.
        """
        if k <= 0 and not self.step_ms:
            return 0.0
        cache = self.__dict__.setdefault("_draft_cache", {})  # the replay asks for the same few values
        key = (int(batch), max(int(k), 0))
        if key not in cache:
            cache[key] = (self._draft_uncached(*key) if key[1] else 0.0) + self.step_overhead(*key)
        return cache[key]

    def step_overhead(self, batch: int, k: int) -> float:
        """``step_ms`` at (batch, k): linear in k between measured k's and in the batch between
        measured batches; beyond the largest batch, in proportion to it (0 without ``step_ms``)."""
        if not self.step_ms:
            return 0.0
        batches = np.array(sorted(self.step_ms), dtype=np.float64)

        def at(b: int) -> float:
            row = self.step_ms[b]
            ks = np.array(sorted(row), dtype=np.float64)
            return float(np.interp(k, ks, [row[int(x)] for x in ks]))

        vals = np.array([at(int(b)) for b in batches])
        if batch > batches[-1]:
            return float(vals[-1]) * batch / float(batches[-1])
        return float(np.interp(batch, batches, vals))

    def _draft_uncached(self, batch: int, k: int) -> float:
        if self.kind == "roofline":
            if self.drafter == "parallel":
                return float(self._roofline("drafter", batch * k))
            return float(k * self._roofline("drafter", batch))
        if self.drafter == "parallel":
            return self._draft_row(batch * k, 1)
        return self._draft_row(batch, k)

    def _draft_row(self, batch: int, k: int) -> float:
        """The measured draft time of ``k`` passes at ``batch``, interpolated over batch sizes."""
        batches = np.array(sorted(self.draft_ms), dtype=np.float64)

        def at(b: int) -> float:
            row = self.draft_ms[b]
            ks = np.array(sorted(row))
            return float(_interp(np.array([k]), ks, np.array([row[x] for x in ks]))[0])

        vals = np.maximum.accumulate(np.array([at(int(b)) for b in batches]))  # a larger batch never drafts faster
        if batch > batches[-1]:
            return float(vals[-1] * batch / batches[-1])
        return float(np.interp(batch, batches, vals))

    def check_covers(self, k: int, where: str = "") -> None:
        """A measured table must reach the run's K in every batch row (no extrapolation there)."""
        if self.kind != "measured":
            return
        for b, row in sorted(self.draft_ms.items()):
            if max(row) < k:
                raise ConfigError(f"{where}`draft_ms[{b}]` stops at k = {max(row)}, but the run drafts K = {k}; "
                                  "profile the pair with that K (`svt collect CONFIG --profile-costs --set k=K`).")


def _interp(x, xs, ys):
    """Linear interpolation, linear extrapolation beyond the last two points (never below 0)."""
    out = np.interp(x, xs, ys)
    if len(xs) >= 2:
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        out = np.where(x > xs[-1], ys[-1] + slope * (x - xs[-1]), out)
    return np.maximum(out, 0.0)

