"""Writing what peers' tools read: a speculation profile, the feature table as a flat file, the
report's tables as LaTeX.

- ``profile`` (from a run): the ``speculation_profile.json`` of NVIDIA Model-Optimizer's
  specdec_bench (its schema 1.0, as its ``speculation_profile.py`` builds it): per-position
  ``conditional_accept_rates`` (P(draft i+1 accepted | the first i were)) and
  ``marginal_accept_rates`` (P(the first i+1 drafts all accepted)) over verification steps, the
  per-step ``mean_accept_length`` (accepted drafts + the target's token) and its histogram keyed by
  acceptance length, per workload, with the same validation (the mean implied by the marginals, and
  their monotonicity); svt's exposure counts per position are kept under ``svt``.
- ``features`` (from a report): one row per feature and scope (all positions, excluding the first,
  each position) with every metric and its bootstrap interval, as CSV or Parquet.
- ``latex`` (from a report): the feature tables as booktabs ``tabular`` environments.
- ``vllm-steps`` and ``specdec-tokens`` (from a run): the formats ``svt import`` reads, so a run
  goes out and comes back with the same labels (and, for ``specdec-tokens``, ``accept_prob``).
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from svt.errors import ConfigError, DataError
from svt.fileio import atomic_path, json_text, read_json, write_text_atomic, writing
from svt.metrics.specs import METRICS, names
from svt.metrics.tables import acceptance_by_position
from svt.traces.io import open_run

PROFILE_FORMAT = "svt speculation profile 1"


def speculation_profile(run_dir: str | Path) -> dict:
    """The speculation profile of a run, in the layout of specdec_bench's ``speculation_profile.json``
    (schema 1.0; see the module doc), with svt's per-position exposure counts under ``svt``."""
    run = open_run(run_dir)
    drafts = run.uncensored_drafts()
    by_pos = acceptance_by_position(drafts)
    if by_pos.height == 0:
        raise DataError(f"{run_dir}: the run has no drafts: no speculation profile.")
    steps = (drafts.filter(pl.col("label").is_not_null())
             .group_by("request", "step").agg((pl.col("label") == 1).sum().alias("accepted"),
                                              pl.col("workload").first()).collect())
    n, k = steps.height, int(by_pos["position"].max()) + 1
    acc = steps["accepted"].to_numpy()
    # survival S(j) = P(a step accepts at least j drafts): marginal_i = S(i + 1), conditional_i =
    # S(i + 1) / S(i), the two conventions specdec_bench publishes side by side
    surv = [float((acc >= j).mean()) for j in range(k + 1)]
    marginal = [surv[i + 1] for i in range(k)]
    conditional = [surv[i + 1] / surv[i] if surv[i] > 0 else 0.0 for i in range(k)]
    mean = float(1 + acc.mean())
    per_request = steps.group_by("request").agg((pl.col("accepted").mean() + 1).alias("al"))["al"].mean()
    histogram = {str(int(r["accepted"]) + 1): int(r["count"])
                 for r in steps["accepted"].value_counts().sort("accepted").iter_rows(named=True)}
    meta = run.meta
    models = meta.get("models") or {}
    kinds = meta.get("drafter_kinds") or []
    method = "suffix" if kinds == ["cache"] else \
        ("draft_model" if meta.get("engine", "svt") != "import" else None)  # an import's method is unknown
    implied = 1.0 + sum(marginal)
    rises = [{"position": i, "value": marginal[i], "previous": marginal[i - 1]}  # a survival never rises
             for i in range(1, k) if marginal[i] > marginal[i - 1] + 1e-9]
    per_category = {str(w): {"mean_accept_length": round(float(1 + g["accepted"].mean()), 6), "steps": g.height}
                    for (w,), g in steps.group_by("workload", maintain_order=True)}
    return {
        "schema_version": "1.0",
        "measured": True,
        "method": method,
        "draft_checkpoint": {"path": (models.get("draft") or {}).get("path")} if models.get("draft") else None,
        "target_model": {"path": (models.get("target") or {}).get("path")} if models.get("target") else None,
        "num_speculative_tokens": k,
        "block_size": None,
        "max_supported_k": k,
        "verification_method": "longest_prefix",
        "conditional_accept_rates": [round(x, 6) for x in conditional],
        "marginal_accept_rates": [round(x, 6) for x in marginal],
        "mean_accept_length": round(mean, 6),
        "mean_accept_length_per_request": round(float(per_request), 6),
        "accept_length_model": "chain_analytic" if method == "draft_model" else "measured_per_k",
        "accept_length_by_k": {str(k): round(mean, 6)},
        "acceptance_length_histogram": histogram,
        "per_category": dict(sorted(per_category.items())),
        "measurement_conditions": {
            "source": "svt run", "run": str(run_dir), "run_id": meta.get("run_id"),
            "engine": meta.get("engine", "svt"), "sampling": meta.get("sampling"), "steps": n,
            **({"imported_from": (meta.get("import") or {}).get("format")} if meta.get("import") else {})},
        "validation": {
            "mean_consistency": {"implied_mean_accept_length": round(implied, 6),
                                 "reported_mean_accept_length": round(mean, 6),
                                 "abs_delta": round(abs(implied - mean), 6), "tolerance": 0.02,
                                 "passed": abs(implied - mean) <= 0.02},
            "marginal_monotonicity": {"passed": not rises, "violations": rises},
        },
        "svt": {"format": PROFILE_FORMAT,
                "acceptance_rate": float(drafts.select(pl.col("label").mean()).collect().item()),
                "per_position": [
                    {"position": int(r["position"]), "proposed": int(r["proposed"]), "verified": int(r["verified"]),
                     "accepted": int(r["accepted"]), "conditional": _num(r["conditional"]),
                     "marginal": _num(r["marginal"])}
                    for r in by_pos.iter_rows(named=True)]},
    }


def _num(x):
    return None if x is None or x != x else float(x)


def feature_rows(report: dict) -> pl.DataFrame:
    """The report's feature table flat: one row per feature and scope, every table metric and, with
    a bootstrap, its interval (``<metric>_lo``, ``<metric>_hi``)."""
    feats = report.get("features") if isinstance(report, dict) else None
    if not isinstance(feats, dict) or not all(isinstance(f, dict) for f in feats.values()):
        raise DataError("Expected a report from `svt evaluate` (report.json with a `features` table).")
    if not feats:
        skipped = report.get("features_not_computed") or {}
        raise DataError("The report scored no feature" + (f" ({', '.join(skipped)} not computed: the run lacks "
                                                          "their columns)" if skipped else "") + ": nothing to export.")
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


def _run_records(run_dir: Path, kind: str) -> list[dict]:
    """One record per request in the layout of ``svt import``'s ``vllm-steps`` or
    ``specdec-tokens`` format."""
    run = open_run(run_dir)
    if run.censored:
        raise DataError(f"{run_dir}: collected with live AV (trimmed drafts have no label); `{kind}` records every "
                        "draft's outcome, so export a run collected without AV.")
    reqs = run.scan("requests").sort("request").collect()
    run_id = run.meta.get("run_id")
    carried = {c for c in ("prompt_ids", "output_ids") if c not in run.lacks("requests")}
    d = run.scan("drafts").sort("request", "step", "position").collect() if run.has("drafts") else None
    if d is None or d.height == 0:
        what = "a reference run: its drafts are the cache's, in cache_drafts" if run.meta.get("engine") == "reference" \
            else "no model drafts"
        raise DataError(f"{run_dir}: `{kind}` carries a model drafter's drafts, and this run has none ({what}).")
    per_step = (d.group_by("request", "step", maintain_order=True)
                .agg(pl.len().alias("drafted"), (pl.col("label") == 1).sum().alias("accepted"), pl.col("token"),
                     pl.col("accept_prob")))
    # every step of the steps table, a step without draft rows as drafted 0 (it is kept, not dropped)
    steps = (run.scan("steps").select("request", "step").collect().sort("request", "step")
             .join(per_step, on=["request", "step"], how="left", maintain_order="left")
             .with_columns(pl.col("drafted").fill_null(0), pl.col("accepted").fill_null(0),
                           pl.col("token").fill_null([]), pl.col("accept_prob").fill_null([])))
    by_req = {r: g for (r,), g in steps.group_by("request", maintain_order=True)}
    out = []
    for row in reqs.iter_rows(named=True):
        g = by_req.get(row["request"])
        rec: dict = {"request_id": row["request"], "workload": row["workload"],
                     # provenance (keys other readers ignore): a fit on this run, evaluated on the
                     # import of this file, scores only its held-out requests
                     **({"svt_run_id": run_id, "svt_request": row["request"]} if isinstance(run_id, str) else {})}
        if kind == "vllm-steps":
            rec["per_step_drafted"] = [] if g is None else g["drafted"].to_list()
            rec["per_step_accepted"] = [] if g is None else g["accepted"].to_list()
        else:
            if g is None:
                continue
            if "token" in run.lacks("drafts") or "accept_prob" in run.lacks("drafts"):
                raise DataError(f"{run_dir}: `specdec-tokens` needs each draft's token and accept_prob, which this "
                                "imported run lacks.")
            rec["steps"] = [{"draft_tokens": t, "p_acc": [float(x) for x in p], "accepted": a}
                            for t, p, a in zip(g["token"].to_list(), g["accept_prob"].to_list(),
                                               g["accepted"].to_list(), strict=True)]
        if "prompt_ids" in carried:
            rec["prompt_token_ids"] = row["prompt_ids"]
        if "output_ids" in carried:
            rec["output_token_ids"] = row["output_ids"]
        out.append(rec)
    return out


def _reads_back(kind: str, source: Path, tmp: Path) -> None:
    """The written file imported as ``svt import`` would (nothing kept): an export that its own
    importer refuses is an error here, before it replaces anything, not a file found broken later."""
    from svt.interop import check_tables, get_importer
    from svt.interop.base import ImportFormatError

    try:
        back = get_importer(kind).read(tmp)
        check_tables(back, str(tmp))
    except ImportFormatError as exc:
        raise DataError(f"{source}: its `{kind}` export would not import again "
                        f"({str(exc).replace(str(tmp), 'the export')}); nothing written.") from None
    # and with the same labels: a step whose drafts were never verified has no place in these
    # formats (drafted and accepted counts), and would come back with a rejection it never had
    d = open_run(source).scan("drafts").select(pl.col("label").is_not_null().sum().alias("labelled"),
                                                (pl.col("label") == 1).sum().alias("accepted")).collect().row(0)
    got = (int(back.drafts["label"].is_not_null().sum()), int((back.drafts["label"] == 1).sum()))
    if tuple(int(x) for x in d) != got:
        raise DataError(f"{source}: its `{kind}` export would come back with {got[0]:,} labelled drafts "
                        f"({got[1]:,} accepted) against the run's {d[0]:,} ({d[1]:,}): the run has drafts the format "
                        "cannot carry (a step whose drafts were never verified, labels that are not a chain's); "
                        "nothing written.")


def _report(path: Path) -> dict:
    return read_json(path / "report.json" if path.is_dir() else path, "Report (a report directory or report.json)")


def _check_out(source: Path, out: Path, overwrite: bool) -> None:
    """--out is a new file (or, with ``overwrite``, an existing plain file) outside SOURCE and
    outside every run directory: an export never replaces its own input or a run's file."""
    if out.is_dir():
        raise ConfigError(f"{out} is a directory; --out takes a file.")
    src, dst = source.resolve(), out.resolve()
    if dst == src or src in dst.parents:
        raise ConfigError(f"--out {out} is (inside) the source {source}; write the export elsewhere.")
    run = next((p for p in dst.parents if (p / "run.json").is_file()), None)
    if run is not None:
        raise ConfigError(f"Refusing to write {out} inside the run directory {run}; write exports beside runs.")
    if out.exists() and not overwrite:
        raise ConfigError(f"{out} exists; pass --overwrite to replace it.")
    what = _svt_document(out) if out.is_file() else None
    if what is not None:  # --overwrite replaces an earlier export, never a report or a fit
        raise ConfigError(f"{out} is {what}; an export does not replace it, even with --overwrite.")


def _svt_document(path: Path) -> str | None:
    """What svt file ``path`` holds, if it is an evaluation report or a fit file."""
    import json

    try:
        doc = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    if not isinstance(doc, dict):
        return None
    if "report_schema" in doc or ("features" in doc and "runs" in doc):
        return "an svt evaluation report"
    if "model" in doc and "training" in doc:
        return f"an svt fit file ({doc.get('model')})"
    return None


def export(kind: str, source: str | Path, out: str | Path, *, overwrite: bool = False) -> Path:
    """``svt export KIND SOURCE --out FILE``: ``profile`` of a run (.json), ``features`` of a report
    (.csv or .parquet), ``latex`` of a report (.tex), ``vllm-steps`` / ``specdec-tokens`` of a run
    (.jsonl). Written atomically; nothing on an error; an existing --out only with ``overwrite``."""
    source, out = Path(source), Path(out)
    suffix = out.suffix.lower()
    wants = {"profile": (".json",), "features": (".csv", ".parquet"), "latex": (".tex",),
             "vllm-steps": (".jsonl",), "specdec-tokens": (".jsonl",)}
    if kind not in wants:
        raise ConfigError(f"Unknown export {kind!r}; known: {', '.join(wants)}.")
    if suffix not in wants[kind]:
        raise ConfigError(f"`{kind}` writes {' or '.join(wants[kind])}, but --out is {out.name!r}.")
    _check_out(source, out, overwrite)  # fails fast; checked again while the output is held
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        with writing(out, lambda: _check_out(source, out, overwrite)):
            return _write(kind, source, out, suffix)
    except OSError as exc:
        raise ConfigError(f"Cannot write {out}: {exc.strerror or exc}.") from None


def _write(kind: str, source: Path, out: Path, suffix: str) -> Path:
    if kind == "profile":
        return write_text_atomic(out, json_text(speculation_profile(source)))
    if kind in ("vllm-steps", "specdec-tokens"):
        lines = [json_text(r, indent=None) for r in _run_records(source, kind)]
        with atomic_path(out) as tmp:
            tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
            _reads_back(kind, source, tmp)
        return out
    report = _report(source)
    try:
        text = latex_tables(report) if kind == "latex" else None
        frame = feature_rows(report) if kind == "features" else None
    except (AttributeError, TypeError, ValueError, KeyError) as exc:  # a damaged report.json
        raise DataError(f"{source}: not a report from `svt evaluate` ({type(exc).__name__}: {exc}).") from None
    if text is not None:
        return write_text_atomic(out, text)
    with atomic_path(out) as tmp:
        if suffix == ".csv":
            frame.write_csv(tmp)
        else:
            frame.write_parquet(tmp)
    return out
