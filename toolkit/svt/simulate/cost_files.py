"""Cost table files: reading a measured or roofline table with every check (each bad entry named),
and writing one atomically. The table itself, and how the replays read it: :mod:`svt.simulate.costs`."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import yaml

from svt.errors import ConfigError
from svt.fileio import read_yaml, write_text_atomic
from svt.simulate.costs import CostTable

MAX_MS = 1e7  # a step of more than about three hours is a typo, and its arithmetic would overflow


def _positive(v: float, key: str, path: Path, *, zero_ok: bool = False, limit: float = np.inf) -> float:
    if not np.isfinite(v) or v < 0 or (v == 0 and not zero_ok) or v > limit:
        raise ConfigError(f"{path}: expected `{key}` to be a finite number {'>= 0' if zero_ok else '> 0'}"
                          f"{f' and at most {limit:g}' if np.isfinite(limit) else ''}, but got {v!r}.")
    return v


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


def _draft_rows(table, name: str, path: Path) -> dict[int, dict[int, float]]:
    """``draft_ms[batch][k]``: keys >= 1, k from 1, positive milliseconds that never fall as k grows."""
    draft = {b: _numbers(row, f"{name}[{b}]", "k", path) for b, row in _numbers(table, name, "batch", path, leaf=False).items()}
    for b, row in draft.items():
        if b < 1 or min(row) != 1:
            raise ConfigError(f"{path}: `{name}` keys (batch, k) must be >= 1 with k from 1, but got batch {b}, k "
                              f"{sorted(row)}.")
        for k, v in row.items():
            _positive(v, f"{name}[{b}][{k}]", path, limit=MAX_MS)
        ks = sorted(row)
        falls = next(((a, c) for a, c in zip(ks, ks[1:], strict=False) if row[c] < row[a]), None)
        if falls:  # cumulative time over k drafts: a profile's medians never fall, a typo does
            raise ConfigError(f"{path}: `{name}[{b}][{falls[1]}]` = {row[falls[1]]} is below `{name}[{b}]"
                              f"[{falls[0]}]` = {row[falls[0]]}; draft_ms is the time of k drafts in all, so it "
                              "cannot fall as k grows.")
    return draft


def _verify_rows(table, path: Path, name: str = "verify_rows_ms") -> dict[int, dict[int, float]]:
    """``verify_rows_ms[rows][tokens a row]``: integer keys >= 1, positive milliseconds."""
    out = {b: _numbers(row, f"{name}[{b}]", "tokens a row", path)
           for b, row in _numbers(table, name, "rows", path, leaf=False).items()}
    for b, row in out.items():
        if b < 1 or any(m < 1 for m in row):
            raise ConfigError(f"{path}: `{name}` keys (rows, tokens a row) must be >= 1, but got rows {b}, "
                              f"tokens {sorted(row)}.")
        for m, v in row.items():
            _positive(v, f"{name}[{b}][{m}]", path, limit=MAX_MS)
    return out


def _grid(table: dict) -> dict:
    return {b: sorted(row) for b, row in sorted(table.items())}


REFIT_SPAN = 2.0  # a table's value lies within [min / this, max * this] of its refits' (a bootstrap's spread)


def _check_replicates(measurement: dict, path: Path, draft: dict, rows_ms: dict) -> None:
    """The fit's bootstrap refits, when kept, are whole tables of the table's own grid: each read
    with the table's checks, and the table's every value within the refits' span (REFIT_SPAN): a
    refit of another table would give ranges that do not hold the table's own figures."""
    fit = measurement.get("fit")
    reps = fit.get("replicates") if isinstance(fit, dict) else None
    if reps is None:
        return
    if not isinstance(reps, list):
        raise ConfigError(f"{path}: `measurement.fit.replicates` must be a list of tables; got {_describe(reps)}.")
    if reps and not rows_ms:
        raise ConfigError(f"{path}: `measurement.fit.replicates` are refits of a `verify_rows_ms` surface, but this "
                          "table gives `verify_ms` in total tokens; drop the refits or give the surface.")
    lo_hi: dict[tuple, list[float]] = {}
    for i, rep in enumerate(reps):
        name = f"measurement.fit.replicates[{i}]"
        if not isinstance(rep, dict) or set(rep) != {"draft_ms", "verify_rows_ms"}:
            raise ConfigError(f"{path}: `{name}` must hold `draft_ms` and `verify_rows_ms`.")
        d = _draft_rows(rep["draft_ms"], f"{name}.draft_ms", path)
        v = _verify_rows(rep["verify_rows_ms"], path, f"{name}.verify_rows_ms")
        if _grid(d) != _grid(draft) or _grid(v) != _grid(rows_ms):
            raise ConfigError(f"{path}: `{name}` is not on the table's grid (its batches, k, rows and tokens a row "
                              "differ): a refit prices the same cells as the table.")
        for what, table in (("draft_ms", d), ("verify_rows_ms", v)):
            for b, row in table.items():
                for k, x in row.items():
                    span = lo_hi.setdefault((what, b, k), [x, x])
                    span[0], span[1] = min(span[0], x), max(span[1], x)
    for (what, b, k), (lo, hi) in lo_hi.items():
        x = (draft if what == "draft_ms" else rows_ms)[b][k]
        if not lo / REFIT_SPAN <= x <= hi * REFIT_SPAN:
            raise ConfigError(f"{path}: `{what}[{b}][{k}]` = {x:g} lies outside its refits' span [{lo:g}, {hi:g}] "
                              f"(by more than a factor {REFIT_SPAN:g}): the refits are not of this table.")


def falls_read_flat(draft: dict, rows_ms: dict) -> list[str]:
    """Where a table's draft time falls as the batch grows, or its verify time as the rows or the
    tokens a row grow (the replays read both as non-decreasing: said in the table's warnings)."""
    out = []
    for k in sorted({k for row in draft.values() for k in row}):
        seen = [(b, row[k]) for b, row in sorted(draft.items()) if k in row]
        out += [f"draft_ms[{c}][{k}] = {y:g} < draft_ms[{a}][{k}] = {x:g}"
                for (a, x), (c, y) in zip(seen, seen[1:], strict=False) if y < x]
    for b, row in sorted(rows_ms.items()):
        ms = sorted(row)
        out += [f"verify_rows_ms[{b}][{n}] = {row[n]:g} < verify_rows_ms[{b}][{m}] = {row[m]:g}"
                for m, n in zip(ms, ms[1:], strict=False) if row[n] < row[m]]
    for m in sorted({m for row in rows_ms.values() for m in row}):
        seen = [(b, row[m]) for b, row in sorted(rows_ms.items()) if m in row]
        out += [f"verify_rows_ms[{c}][{m}] = {y:g} < verify_rows_ms[{a}][{m}] = {x:g}"
                for (a, x), (c, y) in zip(seen, seen[1:], strict=False) if y < x]
    return out


def _describe(v) -> str:
    if isinstance(v, dict):
        return "an empty mapping" if not v else "a mapping"
    if isinstance(v, list):
        return f"a list of {len(v)}"
    return "nothing" if v is None else repr(v)


COMMON = {"kind", "drafter", "description"}
KEYS = {"measured": COMMON | {"draft_ms", "verify_ms", "verify_rows_ms", "step_ms", "measurement", "models", "context",
                              "machine"},
        "roofline": COMMON | {"model", "models"}}


def _load_measured(data: dict, path: Path, drafter: str) -> CostTable:
    if data.get("draft_ms") is None or (isinstance(data.get("draft_ms"), dict) and not data["draft_ms"]):
        raise ConfigError(f"{path}: `draft_ms` must not be empty.")
    draft = _draft_rows(data.get("draft_ms"), "draft_ms", path)
    if ("verify_ms" in data) == ("verify_rows_ms" in data):
        raise ConfigError(f"{path}: a measured table needs exactly one of `verify_ms[tokens]` (total tokens "
                          "alone) and `verify_rows_ms[rows][tokens a row]` (what --profile-costs writes).")
    rows_ms = _verify_rows(data["verify_rows_ms"], path) if "verify_rows_ms" in data else {}
    verify = _numbers(data.get("verify_ms"), "verify_ms", "tokens", path) if "verify_ms" in data else {}
    for t, v in verify.items():
        if t < 1:
            raise ConfigError(f"{path}: `verify_ms` keys (tokens) must be >= 1, but got {t}.")
        _positive(v, f"verify_ms[{t}]", path, limit=MAX_MS)
    measurement = data.get("measurement") or {}
    if not isinstance(measurement, dict) or not isinstance(measurement.get("warnings", []), list):
        raise ConfigError(f"{path}: `measurement` must be a mapping whose `warnings` is a list.")
    _check_replicates(measurement, path, draft, rows_ms)
    if measurement.get("reliable") is False and not measurement.get("warnings"):
        measurement = {**measurement, "warnings": ["the table says it is not reliable (`measurement.reliable: "
                                                   "false`) and gives no reason"]}
    falls = falls_read_flat(draft, rows_ms)
    if falls:  # a profile's fit never falls; a hand-written or edited table may: read flat, and said
        measurement = {**measurement, "warnings": [*measurement.get("warnings", []),
                                                   f"times that fall as the batch, the rows or the tokens grow "
                                                   f"({'; '.join(falls[:3])}{'; ...' if len(falls) > 3 else ''}) "
                                                   "are read as non-decreasing"]}
    models = data.get("models") if isinstance(data.get("models"), dict) else {}
    step = _step_rows(data["step_ms"], path) if "step_ms" in data else {}
    return CostTable("measured", drafter, data.get("description", ""), draft, verify, measurement=measurement,
                     models=models, verify_rows_ms=rows_ms, step_ms=step)


def _step_rows(table, path: Path) -> dict[int, dict[int, float]]:
    """``step_ms[batch][k]``: batch keys >= 1, k keys >= 0, milliseconds >= 0."""
    if not isinstance(table, dict) or not table:
        raise ConfigError(f"{path}: `step_ms` must be a non-empty mapping of batch -> k -> milliseconds.")
    out = {b: _numbers(row, f"step_ms[{b}]", "k", path) for b, row in _numbers(table, "step_ms", "batch", path,
                                                                             leaf=False).items()}
    for b, row in out.items():
        if b < 1 or not row or any(k < 0 for k in row):
            raise ConfigError(f"{path}: `step_ms` keys must be batch >= 1 and k >= 0, but got batch {b}, k {sorted(row)}.")
        for k, v in row.items():
            _positive(v, f"step_ms[{b}][{k}]", path, zero_ok=True, limit=MAX_MS)
    return out


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
        return _load_measured(data, path, drafter)
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
    if table.step_ms:
        data["step_ms"] = {b: {k: round(v, 4) for k, v in row.items()} for b, row in table.step_ms.items()}
    if table.measurement:
        data["measurement"] = table.measurement
    return write_text_atomic(path, yaml.safe_dump(data, sort_keys=False))
