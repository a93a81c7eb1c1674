"""Writing what peers' tools read: a speculation profile, the feature table as a flat file, the
report's tables as LaTeX.

- ``profile`` (from a run): acceptance by draft position, conditional (accepted / verified: the
  chain reached the position) and marginal (accepted / proposed), and the acceptance length
  (accepted drafts per verification step plus the target's token: its mean and distribution), in
  the spirit of the ``speculation_profile.json`` of NVIDIA Model-Optimizer's specdec_bench (whose
  exact upstream schema was not at hand when this was written: the keys are svt's, named in words).
- ``features`` (from a report): one row per feature and scope (all positions, excluding the first,
  each position) with every metric and its bootstrap interval, as CSV or Parquet.
- ``latex`` (from a report): the feature tables as booktabs ``tabular`` environments.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from svt.errors import ConfigError, DataError
from svt.fileio import atomic_path, json_text, read_json, write_text_atomic
from svt.metrics.specs import METRICS, names
from svt.metrics.tables import acceptance_by_position
from svt.traces.io import open_run

PROFILE_FORMAT = "svt speculation profile 1"


def speculation_profile(run_dir: str | Path) -> dict:
    """The speculation profile of a run (see the module doc)."""
    run = open_run(run_dir)
    drafts = run.uncensored_drafts()
    by_pos = acceptance_by_position(drafts)
    if by_pos.height == 0:
        raise DataError(f"{run_dir}: the run has no drafts: no speculation profile.")
    per_step = (drafts.filter(pl.col("label").is_not_null()).group_by("request", "step")
                .agg((pl.col("label") == 1).sum().alias("accepted")).collect())
    lengths = (per_step["accepted"] + 1).value_counts(normalize=False).sort("accepted")
    n = per_step.height
    meta = run.meta
    return {
        "format": PROFILE_FORMAT,
        "run": {"path": str(run_dir), "run_id": meta.get("run_id"), "engine": meta.get("engine", "svt"),
                **({"imported_from": (meta.get("import") or {}).get("format")} if meta.get("import") else {})},
        "k": meta.get("k"),
        "steps": n,
        "acceptance_rate": float(drafts.select(pl.col("label").mean()).collect().item()),
        "acceptance_length": {
            "definition": "accepted drafts per verification step + 1 (the target's token)",
            "mean": float(1 + per_step["accepted"].mean()) if n else None,
            "distribution": {str(int(r["accepted"])): r["count"] / n for r in lengths.iter_rows(named=True)},
        },
        "per_position": [
            {"position": int(r["position"]), "proposed": int(r["proposed"]), "verified": int(r["verified"]),
             "accepted": int(r["accepted"]), "conditional": _num(r["conditional"]), "marginal": _num(r["marginal"])}
            for r in by_pos.iter_rows(named=True)],
    }


def _num(x):
    return None if x is None or x != x else float(x)


def feature_rows(report: dict) -> pl.DataFrame:
    """The report's feature table flat: one row per feature and scope, every table metric and, with
    a bootstrap, its interval (``<metric>_lo``, ``<metric>_hi``)."""
    feats = report.get("features")
    if not isinstance(feats, dict):
        raise DataError("Expected a report from `svt evaluate` (report.json with a `features` table).")
    metrics = [m for m in names("table") if m != "n"]
    rows = []
    for name, f in feats.items():
        scopes = [("all", f), ("excluding_first", f.get("excluding_first") or {}),
                  *((f"position {p}", b) for p, b in sorted((f.get("per_position") or {}).items(),
                                                            key=lambda kv: int(kv[0])))]
        for scope, block in scopes:
            row = {"feature": name, "shown_as": f.get("shown_as") or name, "scope": scope,
                   "lossless": f.get("lossless"), "n": block.get("n")}
            ci = block.get("ci95") or {}
            for m in metrics:
                row[m] = block.get(m)
                lo_hi = ci.get(m) or [None, None]
                row[f"{m}_lo"], row[f"{m}_hi"] = lo_hi
            rows.append(row)
    schema = {"feature": pl.String, "shown_as": pl.String, "scope": pl.String, "lossless": pl.Boolean, "n": pl.Int64,
              **{f"{m}{s}": pl.Float64 for m in metrics for s in ("", "_lo", "_hi")}}
    return pl.DataFrame(rows, schema=schema)


def latex_tables(report: dict) -> str:
    """The feature tables (all positions, excluding the first) as booktabs tabulars."""
    flat = feature_rows(report)
    cols = [m for m in names("table", report=True) if m != "n"]
    out = ["% svt evaluate: feature tables (needs \\usepackage{booktabs})"]
    for scope, title in (("all", "all draft positions"), ("excluding_first", "excluding the first draft position")):
        part = flat.filter(pl.col("scope") == scope)
        out += [f"% {title}", "\\begin{tabular}{l" + "r" * (len(cols) + 1) + "}", "\\toprule",
                " & ".join(["feature", *(_tex(c) for c in cols), "$n$"]) + " \\\\", "\\midrule"]
        for r in part.iter_rows(named=True):
            cells = [_tex(r["shown_as"])]
            for c in cols:
                v = r[c]
                cells.append("--" if v is None else format(v, METRICS[c].fmt))
            cells.append(f"{r['n']:,}".replace(",", "\\,") if r["n"] is not None else "--")
            out.append(" & ".join(cells) + " \\\\")
        out += ["\\bottomrule", "\\end{tabular}", ""]
    return "\n".join(out)


def _tex(s: str) -> str:
    out = []
    for ch in s:  # one character at a time: an escape is never escaped again
        out.append({"\\": "\\textbackslash{}", "_": "\\_", "&": "\\&", "%": "\\%", "#": "\\#", "$": "\\$",
                    "{": "\\{", "}": "\\}", "−": "$-$", "~": "\\textasciitilde{}", "^": "\\textasciicircum{}"}
                   .get(ch, ch))
    return "".join(out)


def _report(path: Path) -> dict:
    return read_json(path / "report.json" if path.is_dir() else path, "Report (a report directory or report.json)")


def export(kind: str, source: str | Path, out: str | Path) -> Path:
    """``svt export KIND SOURCE --out FILE``: ``profile`` of a run (.json), ``features`` of a report
    (.csv or .parquet), ``latex`` of a report (.tex). Written atomically; nothing on an error."""
    source, out = Path(source), Path(out)
    suffix = out.suffix.lower()
    wants = {"profile": (".json",), "features": (".csv", ".parquet"), "latex": (".tex",)}
    if kind not in wants:
        raise ConfigError(f"Unknown export {kind!r}; known: {', '.join(wants)}.")
    if suffix not in wants[kind]:
        raise ConfigError(f"`{kind}` writes {' or '.join(wants[kind])}, but --out is {out.name!r}.")
    if out.is_dir():
        raise ConfigError(f"{out} is a directory; --out takes a file.")
    if kind == "profile":
        return write_text_atomic(out, json_text(speculation_profile(source)))
    report = _report(source)
    if kind == "latex":
        return write_text_atomic(out, latex_tables(report))
    frame = feature_rows(report)
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(out) as tmp:
        if suffix == ".csv":
            frame.write_csv(tmp)
        else:
            frame.write_parquet(tmp)
    return out
