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
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

from svt.errors import ConfigError
from svt.fileio import read_yaml, write_text_atomic


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
                                                 for b, row in rep["verify_rows_ms"].items()}))
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
            key = (int(tokens), None if rows is None else int(rows))
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
        """Milliseconds for the drafter to propose ``k`` tokens for ``batch`` requests.

        Measured tables: an autoregressive drafter pays the measured ``draft_ms[batch][k]`` (k
        sequential passes); a parallel drafter pays one pass over ``batch * k`` tokens, read as the
        measured single-token pass of a batch of that many rows. Batch sizes between measured ones
        are interpolated linearly; beyond the largest, time scales in proportion to the batch.
        """
        if k <= 0:
            return 0.0
        cache = self.__dict__.setdefault("_draft_cache", {})  # the replay asks for the same few values
        key = (int(batch), int(k))
        if key not in cache:
            cache[key] = self._draft_uncached(*key)
        return cache[key]

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

        vals = np.array([at(int(b)) for b in batches])
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


def _positive(v: float, key: str, path: Path, *, zero_ok: bool = False) -> float:
    if not np.isfinite(v) or v < 0 or (v == 0 and not zero_ok):
        raise ConfigError(f"{path}: expected `{key}` to be a finite number {'>= 0' if zero_ok else '> 0'}, "
                          f"but got {v!r}.")
    return v


def _interp(x, xs, ys):
    """Linear interpolation, linear extrapolation beyond the last two points (never below 0)."""
    out = np.interp(x, xs, ys)
    if len(xs) >= 2:
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        out = np.where(x > xs[-1], ys[-1] + slope * (x - xs[-1]), out)
    return np.maximum(out, 0.0)


def _numbers(table, name: str, key: str, path: Path, leaf: bool = True) -> dict:
    """``table`` (a mapping of integer ``key`` to numbers, or to mappings when not ``leaf``) with
    integer keys and float values; the first entry that is not names itself in the error."""
    if isinstance(table, dict) and not table:
        raise ConfigError(f"{path}: `{name}` must not be empty (a mapping of {key} to {'numbers' if leaf else 'mappings'}).")
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: a measured table needs `{name}[{key}]{'' if leaf else '[k]'}`, a mapping of {key} to "
                          f"{'numbers' if leaf else 'mappings'}; got {_describe(table)}.")
    out = {}
    for raw, v in table.items():
        k = raw
        if isinstance(k, str) and re.fullmatch(r"\s*[0-9]+\s*", k):  # a quoted key ("4": 2.1), ASCII digits only
            k = int(k)
        if isinstance(k, bool) or not isinstance(k, int):
            raise ConfigError(f"{path}: `{name}` has the key {k!r}; its keys are {key} counts (integers).")
        if k in out:
            raise ConfigError(f"{path}: `{name}` gives {key} {k} twice (keys {k!r} and {raw!r}); keep one.")
        if leaf and (isinstance(v, bool) or not isinstance(v, int | float)):
            raise ConfigError(f"{path}: expected `{name}[{k}]` to be a number of milliseconds, but got {_describe(v)}.")
        out[k] = float(v) if leaf else v
    return out


def _check_replicates(measurement: dict, path: Path) -> None:
    """The fit's bootstrap refits, when kept, are whole tables: each read as the table itself is."""
    fit = measurement.get("fit")
    reps = fit.get("replicates") if isinstance(fit, dict) else None
    if reps is None:
        return
    if not isinstance(reps, list):
        raise ConfigError(f"{path}: `measurement.fit.replicates` must be a list of tables; got {_describe(reps)}.")
    for i, rep in enumerate(reps):
        if not isinstance(rep, dict) or set(rep) != {"draft_ms", "verify_rows_ms"}:
            raise ConfigError(f"{path}: `measurement.fit.replicates[{i}]` must hold `draft_ms` and `verify_rows_ms`.")
        for b, row in _numbers(rep["draft_ms"], f"replicates[{i}].draft_ms", "batch", path, leaf=False).items():
            for k, v in _numbers(row, f"replicates[{i}].draft_ms[{b}]", "k", path).items():
                _positive(v, f"replicates[{i}].draft_ms[{b}][{k}]", path)
        _verify_rows({"verify_rows_ms": rep["verify_rows_ms"]}, path)


def _verify_rows(data: dict, path: Path) -> dict[int, dict[int, float]]:
    """``verify_rows_ms[rows][tokens a row]``: integer keys >= 1, positive milliseconds."""
    out = {b: _numbers(row, f"verify_rows_ms[{b}]", "tokens a row", path)
           for b, row in _numbers(data["verify_rows_ms"], "verify_rows_ms", "rows", path, leaf=False).items()}
    for b, row in out.items():
        if b < 1 or any(m < 1 for m in row):
            raise ConfigError(f"{path}: `verify_rows_ms` keys (rows, tokens a row) must be >= 1, but got rows {b}, "
                              f"tokens {sorted(row)}.")
        for m, v in row.items():
            _positive(v, f"verify_rows_ms[{b}][{m}]", path)
    return out


def _describe(v) -> str:
    if isinstance(v, dict):
        return "an empty mapping" if not v else "a mapping"
    if isinstance(v, list):
        return f"a list of {len(v)}"
    return "nothing" if v is None else repr(v)


COMMON = {"kind", "drafter", "description"}
KEYS = {"measured": COMMON | {"draft_ms", "verify_ms", "verify_rows_ms", "measurement", "models", "context", "machine"},
        "roofline": COMMON | {"model", "models"}}


def load_costs(path: str | Path) -> CostTable:
    path = Path(path)
    data = read_yaml(path, "Cost table")
    if not isinstance(data, dict) or data.get("kind") not in ("measured", "roofline"):
        raise ConfigError(f"{path}: expected `kind: measured` or `kind: roofline`.")
    unknown = sorted(set(data) - KEYS[data["kind"]])
    if unknown:  # a typo (`verify_mss`) would leave the table without what it meant to say
        raise ConfigError(f"{path}: unknown key(s) {', '.join(map(repr, unknown))} in a {data['kind']} table; "
                          f"known: {', '.join(sorted(KEYS[data['kind']]))}.")
    drafter = data.get("drafter", "autoregressive")
    if drafter not in ("autoregressive", "parallel"):
        raise ConfigError(f"{path}: expected `drafter` autoregressive or parallel, but got {drafter!r}.")
    if data["kind"] == "measured":
        draft = {b: _numbers(row, f"draft_ms[{b}]", "k", path)
                 for b, row in _numbers(data.get("draft_ms"), "draft_ms", "batch", path, leaf=False).items()}
        if ("verify_ms" in data) == ("verify_rows_ms" in data):
            raise ConfigError(f"{path}: a measured table needs exactly one of `verify_ms[tokens]` (total tokens "
                              "alone) and `verify_rows_ms[rows][tokens a row]` (what --profile-costs writes).")
        rows_ms = _verify_rows(data, path) if "verify_rows_ms" in data else {}
        verify = _numbers(data.get("verify_ms"), "verify_ms", "tokens", path) if "verify_ms" in data else {}
        if not draft or any(not row for row in draft.values()):
            raise ConfigError(f"{path}: `draft_ms` must not be empty.")
        for b, row in draft.items():
            if b < 1 or any(k < 1 for k in row):
                raise ConfigError(f"{path}: `draft_ms` keys (batch, k) must be >= 1, but got batch {b}, k {sorted(row)}.")
            for k, v in row.items():
                _positive(v, f"draft_ms[{b}][{k}]", path)
            ks = sorted(row)
            falls = next(((a, c) for a, c in zip(ks, ks[1:], strict=False) if row[c] < row[a]), None)
            if falls:  # cumulative time over k drafts: a profile's medians never fall, a typo does
                raise ConfigError(f"{path}: `draft_ms[{b}][{falls[1]}]` = {row[falls[1]]} is below `draft_ms[{b}]"
                                  f"[{falls[0]}]` = {row[falls[0]]}; draft_ms is the time of k drafts in all, so it "
                                  "cannot fall as k grows.")
        for t, v in verify.items():
            if t < 1:
                raise ConfigError(f"{path}: `verify_ms` keys (tokens) must be >= 1, but got {t}.")
            _positive(v, f"verify_ms[{t}]", path)
        measurement = data.get("measurement") or {}
        if not isinstance(measurement, dict) or not isinstance(measurement.get("warnings", []), list):
            raise ConfigError(f"{path}: `measurement` must be a mapping whose `warnings` is a list.")
        _check_replicates(measurement, path)
        if measurement.get("reliable") is False and not measurement.get("warnings"):
            measurement = {**measurement, "warnings": ["the table says it is not reliable (`measurement.reliable: "
                                                       "false`) and gives no reason"]}
        models = data.get("models") if isinstance(data.get("models"), dict) else {}
        return CostTable("measured", drafter, data.get("description", ""), draft, verify, measurement=measurement,
                         models=models, verify_rows_ms=rows_ms)
    model = data.get("model") or {}
    bools = [f"model.{k}" for k, v in model.items() if isinstance(v, bool)] + [
        f"model.{who}.{k}" for who in ("target", "drafter") if isinstance(model.get(who), dict)
        for k, v in model[who].items() if isinstance(v, bool)]
    if bools:  # YAML reads yes/on/true as booleans: never a number of bytes or seconds
        raise ConfigError(f"{path}: `{bools[0]}` is a boolean; a roofline model needs numbers there.")
    try:  # YAML 1.1 reads 3.35e12 as a string: numbers are converted here, once
        model = {"bandwidth_bytes_per_s": float(model["bandwidth_bytes_per_s"]),
                 "peak_flops": float(model["peak_flops"]),
                 **{who: {key: float(model[who][key]) for key in ("params", "weight_bytes", "overhead_s")}
                    for who in ("target", "drafter")}}
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"{path}: a roofline model needs numbers for `model.target` and `model.drafter` "
                          f"(params, weight_bytes, overhead_s) ({exc}).") from None
    for key in ("bandwidth_bytes_per_s", "peak_flops"):
        _positive(model[key], f"model.{key}", path)
    for who in ("target", "drafter"):
        for key in ("params", "weight_bytes", "overhead_s"):
            _positive(model[who][key], f"model.{who}.{key}", path, zero_ok=key == "overhead_s")
    return CostTable("roofline", drafter, data.get("description", ""), model=model)


def check_costs_out(path: str | Path, *, overwrite: bool = False) -> None:
    """Refuse an output that is a directory, not YAML, or an existing file (unless ``overwrite``)."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{path} is a directory; --profile-costs writes one cost table file (e.g. costs.yaml).")
    if path.suffix.lower() not in (".yaml", ".yml"):
        raise ConfigError(f"Expected a cost table file ending in .yaml, but got {path.name!r}.")
    if path.exists() and not overwrite:
        raise ConfigError(f"{path} exists; pass --overwrite to replace it.")


def write_costs(table: CostTable, path: str | Path, extra: dict | None = None) -> Path:
    """Write the cost table atomically (temporary name, then rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"kind": table.kind, "drafter": table.drafter, "description": table.description,
            **(extra or {}),
            "draft_ms": {b: {k: round(v, 4) for k, v in row.items()} for b, row in table.draft_ms.items()},
            **({"verify_rows_ms": {b: {m: round(v, 4) for m, v in row.items()} for b, row in table.verify_rows_ms.items()}}
               if table.verify_rows_ms else {"verify_ms": {t: round(v, 4) for t, v in table.verify_ms.items()}})}
    if table.measurement:
        data["measurement"] = table.measurement
    return write_text_atomic(path, yaml.safe_dump(data, sort_keys=False))
