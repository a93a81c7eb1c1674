"""Cost tables: how long drafting k tokens for a batch and verifying n tokens take.

Two kinds of file (YAML):

- ``kind: measured`` — ``draft_ms[batch][k]`` and ``verify_ms[tokens]`` tables written by
  ``svt collect --profile-costs`` (medians of timed repeats on a real pair and device);
- ``kind: roofline`` — a **model**, not a measurement: a forward pass over t tokens takes
  max(weight bytes / memory bandwidth, 2 * params * t / peak FLOP/s) + a fixed overhead, for the
  target and the drafter; the file names where its constants come from.

``drafter: autoregressive`` pays one drafter pass per draft token; ``parallel`` drafts all K in one
pass (the Adaptive Verification source, "Limitations").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

from svt.errors import ConfigError
from svt.fileio import read_yaml


@dataclass
class CostTable:
    kind: str
    drafter: str = "autoregressive"
    description: str = ""
    draft_ms: dict[int, dict[int, float]] = field(default_factory=dict)  # measured: [batch][k]
    verify_ms: dict[int, float] = field(default_factory=dict)  # measured: [tokens]
    model: dict = field(default_factory=dict)  # roofline constants

    def _roofline(self, who: str, tokens) -> np.ndarray:
        m = self.model[who]
        t = np.asarray(tokens, dtype=np.float64)
        mem = m["weight_bytes"] / self.model["bandwidth_bytes_per_s"]
        compute = 2.0 * m["params"] * t / self.model["peak_flops"]
        return (np.maximum(mem, compute) + m["overhead_s"]) * 1e3

    def verify(self, tokens) -> np.ndarray:
        """Milliseconds to verify ``tokens`` tokens in one target forward (vectorised)."""
        t = np.asarray(tokens, dtype=np.float64)
        if self.kind == "roofline":
            return self._roofline("target", t)
        xs = np.array(sorted(self.verify_ms))
        # timing noise can make a measured table dip; more tokens never take less time
        ys = np.maximum.accumulate(np.array([self.verify_ms[x] for x in xs]))
        return _interp(t, xs, ys)

    def draft(self, batch: int, k: int) -> float:
        """Milliseconds for the drafter to propose ``k`` tokens for ``batch`` requests."""
        if k <= 0:
            return 0.0
        if self.kind == "roofline":
            if self.drafter == "parallel":
                return float(self._roofline("drafter", batch * k))
            return float(k * self._roofline("drafter", batch))
        if self.drafter == "parallel":
            k = 1
        batches = np.array(sorted(self.draft_ms))
        b = int(batches[np.argmin(np.abs(batches - batch))]) if batch not in self.draft_ms else batch
        row = self.draft_ms[b]
        ks = np.array(sorted(row))
        val = float(_interp(np.array([k]), ks, np.array([row[x] for x in ks]))[0])
        return val * (batch / b) if b != batch and batch > batches.max() else val


def _interp(x, xs, ys):
    """Linear interpolation, linear extrapolation beyond the last two points (never below 0)."""
    out = np.interp(x, xs, ys)
    if len(xs) >= 2:
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        out = np.where(x > xs[-1], ys[-1] + slope * (x - xs[-1]), out)
    return np.maximum(out, 0.0)


def load_costs(path: str | Path) -> CostTable:
    path = Path(path)
    data = read_yaml(path, "Cost table")
    if not isinstance(data, dict) or data.get("kind") not in ("measured", "roofline"):
        raise ConfigError(f"{path}: expected `kind: measured` or `kind: roofline`.")
    drafter = data.get("drafter", "autoregressive")
    if drafter not in ("autoregressive", "parallel"):
        raise ConfigError(f"{path}: expected `drafter` autoregressive or parallel, but got {drafter!r}.")
    if data["kind"] == "measured":
        try:
            draft = {int(b): {int(k): float(v) for k, v in row.items()} for b, row in data["draft_ms"].items()}
            verify = {int(t): float(v) for t, v in data["verify_ms"].items()}
        except (KeyError, AttributeError, TypeError, ValueError):
            raise ConfigError(f"{path}: a measured table needs `draft_ms[batch][k]` and "
                              "`verify_ms[tokens]` mappings of numbers.") from None
        return CostTable("measured", drafter, data.get("description", ""), draft, verify)
    model = data.get("model") or {}
    try:  # YAML 1.1 reads 3.35e12 as a string: numbers are converted here, once
        model = {"bandwidth_bytes_per_s": float(model["bandwidth_bytes_per_s"]),
                 "peak_flops": float(model["peak_flops"]),
                 **{who: {key: float(model[who][key]) for key in ("params", "weight_bytes", "overhead_s")}
                    for who in ("target", "drafter")}}
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"{path}: a roofline model needs numbers for `model.target` and `model.drafter` "
                          f"(params, weight_bytes, overhead_s) ({exc}).") from None
    return CostTable("roofline", drafter, data.get("description", ""), model=model)


def write_costs(table: CostTable, path: str | Path, extra: dict | None = None) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"kind": table.kind, "drafter": table.drafter, "description": table.description,
            **(extra or {}),
            "draft_ms": {b: {k: round(v, 4) for k, v in row.items()} for b, row in table.draft_ms.items()},
            "verify_ms": {t: round(v, 4) for t, v in table.verify_ms.items()}}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path
