"""Judging one metric of a regression report: its direction, threshold and verdict (see
:mod:`svt.report.compare` for the rules), and the tolerances a user may give."""

from __future__ import annotations

import math
import re

from svt.errors import ConfigError
from svt.metrics.specs import METRICS, names

TABLE_SCOPES = ("overall", "excluding_first", "per_position", "group")


def compared() -> dict:
    """The metrics the regression report judges (those with a default tolerance), by name; read
    when judging, so a metric registered by a section's module is judged too."""
    return {m.name: m for m in METRICS.values() if m.tolerance is not None}


def scope_metrics() -> dict[str, tuple[str, ...]]:
    """The compared metrics of each scope a tolerance may name: the feature table's scopes, and
    each other metric group (``simulation``, ``yield``, ``hvd``, ...)."""
    groups = sorted({m.group for m in compared().values()} - {"table"},
                    key=lambda g: [m.group for m in METRICS.values()].index(g))
    return {**dict.fromkeys(TABLE_SCOPES, names("table", compared=True)),
            **{g: names(g, compared=True) for g in groups}}


def parse_tolerances(specs: list[str] | None) -> dict[str, float]:
    """``["auc=0.005", "per_position.auc=0.02"]`` -> ``{"auc": 0.005, "per_position.auc": 0.02}``."""
    out: dict[str, float] = {}
    for spec in specs or []:
        key, sep, value = spec.partition("=")
        key = key.strip()
        scope, dot, metric = key.rpartition(".")
        scopes = scope_metrics()
        if not sep or metric not in compared() or (dot and scope not in scopes):
            raise ConfigError(f"Bad --tolerance {spec!r}: expected METRIC=VALUE or SCOPE.METRIC=VALUE with "
                              f"METRIC one of {', '.join(compared())} and SCOPE one of {', '.join(scopes)}.")
        if dot and metric not in scopes[scope]:
            raise ConfigError(f"Bad --tolerance {spec!r}: scope {scope} has the metrics "
                              f"{', '.join(scopes[scope])}, not {metric}.")
        value = value.strip()
        try:
            tol = float(value) if re.fullmatch(r"[0-9.eE+-]+", value) else math.nan
        except ValueError:
            tol = math.nan
        if not math.isfinite(tol) or tol < 0:
            raise ConfigError(f"Bad --tolerance {spec!r}: the value must be a finite number >= 0.")
        out[key] = tol
    return out


def metric_value(v, metric: str) -> float | None:
    """A metric's value if it is a real number in the metric's range, else None (null, NaN, a string,
    a boolean, an AUC of 1.5: a damaged or undefined value is never compared as a number)."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    try:
        v = float(v)
    except OverflowError:
        return None
    spec = METRICS.get(metric)
    if not math.isfinite(v) or v < 0 or (spec is not None and spec.unit and v > 1):
        return None
    return v


def _threshold(metric: str, scope: str, base: float, ci, tolerances: dict) -> tuple[str, float | None, list | None]:
    """(basis, tolerance in metric units or None, interval or None)."""
    for key, basis in ((f"{scope}.{metric}", "tolerance"), (metric, "tolerance")):
        if key in tolerances:
            tol = tolerances[key]
            return basis, tol * abs(base) if METRICS[metric].relative else tol, None
    if _valid(ci, metric):
        return "95% CI", None, [min(ci[0], base), max(ci[1], base)]
    tol = METRICS[metric].tolerance
    return "default tolerance", tol * abs(base) if METRICS[metric].relative else tol, None


def _valid(ci, metric: str = "auc") -> bool:
    """Two numbers in the metric's range, lo <= hi."""
    if not isinstance(ci, list | tuple) or len(ci) != 2:
        return False
    lo, hi = (metric_value(x, metric) for x in ci)
    return lo is not None and hi is not None and lo <= hi


def judge(metric: str, scope: str, base, now, ci=None, tolerances: dict | None = None, ci_now=None) -> dict:
    """One metric's verdict (see the module docstring). ``ci_now``: the new report's own interval,
    when it has one: the change is then judged against the interval of a difference of two
    independent estimates, sqrt(a² + b²) of the two half-widths, and never less than the baseline's
    own interval."""
    d = METRICS[metric].direction
    basis, tol, interval = _threshold(metric, scope, base, ci, tolerances or {})
    combined = (math.hypot((interval[1] - interval[0]) / 2, (ci_now[1] - ci_now[0]) / 2)
                if interval is not None and _valid(ci_now, metric) else None)
    row = {"metric": metric, "scope": scope, "baseline": base, "now": now, "direction": "higher" if d > 0 else "lower",
           "basis": basis, "tolerance": tol, "interval": interval, "combined": combined}
    if now is None:
        return {**row, "difference": None, "verdict": "missing now", "excess": math.inf}
    diff = now - base
    worse = -d * diff  # > 0: worse
    if interval is not None:
        bad_room = (base - interval[0]) if d > 0 else (interval[1] - base)
        good_room = (interval[1] - base) if d > 0 else (base - interval[0])
        if combined is not None:
            bad_room, good_room = max(bad_room, combined), max(good_room, combined)
        inside = "noise"
    else:
        bad_room = good_room = tol
        inside = "within tolerance"
    if diff == 0:
        verdict = "unchanged"
    elif worse > bad_room:
        verdict = "regressed"
    elif -worse > good_room:
        verdict = "improved"
    else:
        verdict = inside
    excess = worse / bad_room if bad_room > 0 else (math.inf if worse > 0 else (0.0 if worse == 0 else -math.inf))
    return {**row, "difference": diff, "verdict": verdict, "excess": excess}


def costs_match(name: str, b: dict, n: dict, skipped: list[str]) -> bool:
    fb, fn = (b.get("costs") or {}).get("fingerprint"), (n.get("costs") or {}).get("fingerprint")
    if fb != fn:
        skipped.append(f"{name}: the cost tables differ (fingerprint {fb} against {fn}; a measured table is "
                       "re-measured on every machine), so its throughputs are not compared")
        return False
    return True


def missing_row(section: str, item: str, where: str, metric: str, scope: str, base) -> dict:
    """A row for something the baseline has and the new report lacks: a regression."""
    return {**judge(metric, scope, base, None), "section": section, "item": item, "where": where}


def keyed(items: list, key, what: str) -> dict:
    out: dict = {}
    for it in items:
        k = key(it)
        if k in out:
            raise ValueError(f"{what} {k} appears twice")
        out[k] = it
    return out


def format_number(v, metric: str) -> str:
    if v is None:
        return "—"
    if metric in ("throughput", "interactivity"):
        return f"{v:,.1f}"
    return f"{v:.4f}"


def threshold_text(r: dict) -> str:
    if r["interval"] is not None:
        text = f"95% CI [{format_number(r['interval'][0], r['metric'])}, {format_number(r['interval'][1], r['metric'])}]"
        return text + (f", difference ±{format_number(r['combined'], r['metric'])}" if r.get("combined") is not None else "")
    return f"±{format_number(r['tolerance'], r['metric'])} ({'tolerance' if r['basis'] == 'tolerance' else 'default'})"


MARK = {"regressed": "❌ regressed", "missing now": "❌ missing or invalid now", "improved": "✅ improved",
        "noise": "noise", "within tolerance": "within tolerance", "unchanged": "unchanged"}
