"""Comparing an evaluation report with a saved baseline: the regression report of CI jobs and pull
requests (`svt evaluate ... --baseline OLD/report.json`, `svt compare OLD NEW`).

Every metric both reports hold is compared in its own direction (AUC, throughput, precision: higher
is better; log-loss, ECE, Brier, MSE: lower is better) and given a verdict:

- ``regressed``: worse by more than its threshold (the run fails);
- ``improved``: better by more than its threshold;
- ``noise``: a change inside the baseline's 95 % bootstrap interval (or, when the new report has
  intervals too, inside the interval of the difference: sqrt(a² + b²) of the two half-widths);
- ``within tolerance``: a change no larger than the tolerance;
- ``unchanged``: equal.

The threshold of a metric is, in this order: a tolerance given for it (``per_position.auc=0.02``
for one scope, ``auc=0.005`` for every scope); else the baseline's 95 % interval where the baseline
was evaluated with ``--bootstrap`` (the baseline's value is always taken as inside its interval);
else the default tolerance below. Tolerances of throughput, interactivity, MSE and MAE are shares of
the baseline value; the others are absolute.

When both reports scored the same data (the same requests, steps, draft tokens and labels, with
draft probabilities equal within a float tolerance: the same collection, or a deterministic
re-collection on this or another machine; :mod:`svt.traces.identity`), a difference cannot be
sampling noise, so intervals are not used and the tolerances decide; this is what catches a changed
predictor in CI. The report says which decision it took and why.

Reports that do not measure the same thing are refused (:class:`IncomparableError`, exit code 6):
another report schema, other runs (models, K, sampling, workloads, sizes), other features or
settings. A replay whose cost tables differ is listed as not compared rather than judged.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from svt.errors import ConfigError, IncomparableError
from svt.fileio import atomic_path, json_text, read_json
from svt.report.judge import MARK, format_number, threshold_text
from svt.report.sections import SECTIONS, Judging
from svt.traces.identity import SCORE_TOLERANCE, same_data

VERDICT_ORDER = {"regressed": 0, "missing now": 0, "within tolerance": 1, "noise": 1, "unchanged": 2, "improved": 3}
EXIT_REGRESSED = 1


def load_report(path: str | Path, what: str = "Report") -> dict:
    """A report.json (or a report directory holding one), checked to be an svt report."""
    path = Path(path)
    if path.is_dir():
        path = path / "report.json"
    rep = read_json(path, what)
    if isinstance(rep, dict) and rep.get("kind") == "trees" and isinstance(rep.get("trees"), dict):
        raise ConfigError(f"{path}: an svt report of a tree run (`kind: trees`). `svt compare` judges reports "
                          "of chain runs only; tree reports are not compared yet (read their report.md side by side).")
    if not isinstance(rep, dict) or not isinstance(rep.get("features"), dict) or not isinstance(rep.get("runs"), list):
        raise ConfigError(f"{path}: not an svt evaluation report (no 'features' and 'runs').")
    # a report of runs without model drafts (reference runs) has no features: its yield and HVD rows
    # compare; an imported run without draft probabilities has none either: its acceptance, its
    # groups and its replays compare (the sections it has)
    other = ("acceptance", "groups_acceptance", "simulation", "yield", "hvd")
    if not rep["runs"] or not all(isinstance(r, dict) for r in rep["runs"]):
        raise ConfigError(f"{path}: a damaged report (no runs); nothing to compare.")
    if not rep["features"] and not any(rep.get(k) for k in other):
        raise ConfigError(f"{path}: the report holds no features and none of {', '.join(other)}; nothing to compare.")
    rep["_path"] = str(path)
    return rep


def comparability_problems(base: dict, now: dict) -> list[str]:
    """Why two reports do not measure the same thing (empty when they do)."""
    from svt.report.schema import REPORT_SCHEMA

    problems = []
    sb, sn = base.get("report_schema"), now.get("report_schema")
    if type(sb) is not int or type(sn) is not int:
        return [f"report_schema {sb!r} (baseline) and {sn!r} (now): expected the integer {REPORT_SCHEMA} in both "
                "(a damaged report, or one written by an older svt)"]
    if sb != sn or sb != REPORT_SCHEMA:
        old = [name for name, v in (("the baseline", sb), ("the new report", sn)) if v is None]
        return [f"report schema {sb} (baseline) against {sn} (now); this svt reads schema {REPORT_SCHEMA}"
                + (f" — {' and '.join(old)} was written by an older svt (no report_schema)" if old else "")]
    if len(base["runs"]) != len(now["runs"]):
        problems.append(f"{len(base['runs'])} run(s) in the baseline against {len(now['runs'])} now")
    for i, (rb, rn) in enumerate(zip(base["runs"], now["runs"], strict=False)):
        eb, en = rb.get("experiment"), rn.get("experiment")
        if not isinstance(eb, dict) or not isinstance(en, dict) or not eb or not en:
            problems.append(f"run {i + 1}: a report without its experiment (damaged, or not written by svt): "
                            "what it measured cannot be checked")
            continue
        for key in sorted(set(eb) | set(en)):
            if eb.get(key) != en.get(key):
                problems.append(f"run {i + 1} ({rb.get('run')} / {rn.get('run')}): {key} "
                                f"{_short(eb.get(key))} against {_short(en.get(key))}")
    fb, fn = list(base["features"]), list(now["features"])
    if set(fb) != set(fn):
        gone, new = sorted(set(fb) - set(fn)), sorted(set(fn) - set(fb))
        problems.append("features differ: " + "; ".join(
            x for x in (f"only in the baseline: {', '.join(gone)}" if gone else "",
                        f"only now: {', '.join(new)}" if new else "") if x))
    for key in ("n_bins", "by", "labels", "high_yield"):
        vb, vn = base.get("settings", {}).get(key), now.get("settings", {}).get(key)
        if vb != vn:
            problems.append(f"setting {key}: {vb!r} against {vn!r}")
    gb, gn = base.get("groups") or {}, now.get("groups") or {}
    for g in set(gb) | set(gn):
        if set(gb.get(g, {})) != set(gn.get(g, {})):
            problems.append(f"groups by {g}: {sorted(gb.get(g, {}))} against {sorted(gn.get(g, {}))}")
            continue
        for key in gb.get(g, {}):
            if set(gb[g][key]) != set(gn[g][key]):
                problems.append(f"group {g}={key}: features {sorted(gb[g][key])} against {sorted(gn[g][key])}")
    return problems


def _short(v) -> str:
    s = json.dumps(v, sort_keys=True) if isinstance(v, dict | list) else repr(v)
    return s if len(s) <= 80 else s[:77] + "..."


def pairing(base: dict, now: dict, tolerance: float = SCORE_TOLERANCE) -> dict:
    """Whether both reports scored the same data, run by run (see :mod:`svt.traces.identity`: equal
    requests, steps, draft tokens and labels, and draft probabilities equal within ``tolerance``),
    and why: ``{"paired": bool, "reason": str, "tolerance": float}``."""
    reasons, paired = [], True
    for i, (rb, rn) in enumerate(zip(base["runs"], now["runs"], strict=True)):
        ib, in_ = rb.get("data_identity"), rn.get("data_identity")
        if ib is None and in_ is None and rb.get("data_sha256") is not None:
            same = rb.get("data_sha256") == rn.get("data_sha256")  # reports without identities: exact only
            why = "identical drafts (equal data fingerprints)" if same else "different data fingerprints"
        else:
            same, why = same_data(ib, in_, tolerance)
        paired = paired and same
        reasons.append(why if len(base["runs"]) == 1 else f"run {i + 1}: {why}")
    return {"paired": paired, "reason": "; ".join(reasons), "tolerance": tolerance}


def _damaged(what: str, exc: Exception) -> ConfigError:
    return ConfigError(f"A report is damaged or not written by svt ({what}: {type(exc).__name__}: {exc}).")


def compare_reports(base: dict, now: dict, tolerances: dict | None = None,
                    score_tolerance: float = SCORE_TOLERANCE) -> dict:
    """The regression report of ``now`` against ``base`` (raises IncomparableError, or ConfigError
    for a damaged report)."""
    tolerances = tolerances or {}
    try:
        problems = comparability_problems(base, now)
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise _damaged("reading its runs, features and settings", exc) from None
    if problems:
        raise IncomparableError("The reports cannot be compared (refresh the baseline if the change is "
                                "deliberate):\n  - " + "\n  - ".join(problems))
    # on the same data a difference is the code's, not sampling noise: intervals do not apply
    try:
        pair = pairing(base, now, score_tolerance)
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise _damaged("reading its data identities", exc) from None
    judging = Judging(tolerances, pair["paired"])
    rows: list[dict] = []
    for section in SECTIONS:
        try:
            rows += section.compare(base, now, judging)
        except (AttributeError, KeyError, TypeError, ValueError, OverflowError) as exc:
            raise _damaged(f"reading its {section.name} section", exc) from None
    paired, skipped = judging.paired, judging.skipped
    family = family_wise(rows)
    rows.sort(key=lambda r: (VERDICT_ORDER[r["verdict"]], -r["excess"] if math.isfinite(r["excess"]) else
                             (-math.inf if r["excess"] > 0 else math.inf)))
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["verdict"]] = counts.get(r["verdict"], 0) + 1
    regressed = counts.get("regressed", 0) + counts.get("missing now", 0)
    return {"verdict": "regressed" if regressed else "ok", "regressed": regressed, "compared": len(rows),
            "same_draws": paired, "pairing": pair, "family_wise": family,
            "counts": counts, "tolerances": tolerances, "not_compared": skipped,
            "baseline": _about(base), "now": _about(now), "rows": rows}


def family_wise(rows: list[dict], alpha: float = 0.05) -> dict:
    """Different draws of one experiment: a change is judged against the intervals of every metric
    at once. At 95 % per metric, about 1 in 20 of hundreds of metrics would fall outside by chance
    alone (measured: 16 of 286 feature metrics between two seeds of the CI experiment), so the
    interval half-widths are widened to a family-wise 95 % band (Bonferroni over the metrics judged
    by intervals, normal quantiles: z = Φ⁻¹(1 − α/2m) against 1.96). The metrics are correlated, so
    this is conservative; on the same data (paired reports) tolerances decide and nothing changes.
    Re-judges those rows in place; returns what it did."""
    from statistics import NormalDist

    judged = [r for r in rows if r["interval"] is not None and r["difference"] is not None]
    m = len(judged)
    if m < 2:
        return {"metrics": m, "scale": 1.0}
    z = NormalDist().inv_cdf(1 - alpha / (2 * m))
    scale = z / NormalDist().inv_cdf(1 - alpha / 2)
    for r in judged:
        d = 1 if r["direction"] == "higher" else -1
        lo, hi = r["interval"]
        bad, good = (r["baseline"] - lo, hi - r["baseline"]) if d > 0 else (hi - r["baseline"], r["baseline"] - lo)
        if r["combined"] is not None:
            bad, good = max(bad, r["combined"]), max(good, r["combined"])
        bad, good = bad * scale, good * scale
        worse = -d * r["difference"]
        r["verdict"] = ("unchanged" if r["difference"] == 0 else "regressed" if worse > bad
                        else "improved" if -worse > good else "noise")
        r["excess"] = worse / bad if bad > 0 else (math.inf if worse > 0 else (0.0 if worse == 0 else -math.inf))
        r["family_scale"] = scale
    return {"metrics": m, "scale": scale, "alpha": alpha}


def _about(rep: dict) -> dict:
    acc = rep.get("acceptance") or {}
    return {"path": rep.get("_path"), "svt_version": rep.get("svt_version"), "created": rep.get("created"),
            "runs": [{"run": r.get("run"), "run_id": r.get("run_id")} for r in rep["runs"]],
            "labelled": acc.get("labelled"), "acceptance": acc.get("rate"),
            "bootstrap": (rep.get("settings") or {}).get("bootstrap")}


# --- writing -------------------------------------------------------------------------------------

def _md_rows(rows: list[dict]) -> list[str]:
    out = ["| section | predictor / policy | where | metric | baseline | now | difference | threshold | verdict |",
           "|---|---|---|---|---|---|---|---|---|"]
    def cell(v) -> str:  # a name may hold a pipe or a newline: keep the table a table
        return str(v).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ").replace("\r", " ")

    for r in rows:
        diff = "—" if r["difference"] is None else f"{r['difference']:+.4f}" if r["metric"] not in (
            "throughput", "interactivity") else f"{r['difference']:+,.1f}"
        arrow = "↑" if r["direction"] == "higher" else "↓"
        out.append(f"| {cell(r['section'])} | {cell(r['item'])} | {cell(r['where'])} | {r['metric']} {arrow} | "
                   f"{format_number(r['baseline'], r['metric'])} | {format_number(r['now'], r['metric'])} | {diff} | "
                   f"{threshold_text(r)} | {MARK[r['verdict']]} |")
    return out


def to_markdown(result: dict, top: int = 25) -> str:
    """regression.md: the verdict, then the metrics worst first (fit for a PR comment or a CI job
    summary), then every compared metric in a collapsed section."""
    c = result["counts"]
    b, n = result["baseline"], result["now"]
    head = ("**REGRESSED**: " + f"{result['regressed']} of {result['compared']} metrics are worse than their "
            "threshold." if result["verdict"] == "regressed" else
            f"**OK**: no metric regressed ({result['compared']} compared).")
    lines = ["# svt regression report\n", head + " " + ", ".join(f"{v} {k}" for k, v in sorted(
        c.items(), key=lambda kv: VERDICT_ORDER[kv[0]])) + ".\n",
             f"- baseline: `{b['path']}` (svt {b['svt_version']}, {b['created']}; "
             f"{_fmt_count(b['labelled'])} labelled drafts, acceptance {_fmt_rate(b['acceptance'])}; "
             f"bootstrap {b['bootstrap']})",
             f"- now: `{n['path']}` (svt {n['svt_version']}, {n['created']}; "
             f"{_fmt_count(n['labelled'])} labelled drafts, acceptance {_fmt_rate(n['acceptance'])})",
             ("- the same data were scored in both: differences come from the code, not from sampling, so "
              "tolerances decide, not the bootstrap intervals" if result.get("same_draws") else
              "- different draws of the experiment: bootstrap intervals (where the baseline has them) separate "
              "noise from regressions"),
             f"- why: {(result.get('pairing') or {}).get('reason', 'no pairing recorded')}",
             *([f"- {result['family_wise']['metrics']} metrics were judged by intervals: each half-width is widened "
                f"×{result['family_wise']['scale']:.2f} to a family-wise 95 % band (Bonferroni), so that two draws of "
                "one experiment do not show regressions by chance"]
               if (result.get("family_wise") or {}).get("scale", 1.0) > 1.0 else []),
             "- verdicts: worse than the threshold = regressed; inside the baseline's 95% bootstrap interval = "
             "noise; ↑ higher is better, ↓ lower is better. Thresholds: a `--tolerance` when given, else the "
             "baseline's interval, else the default tolerance (throughput and MSE/MAE: a share of the baseline).",
             ""]
    if result["tolerances"]:
        lines += ["Tolerances given: " + ", ".join(f"`{k}={v:g}`" for k, v in result["tolerances"].items()) + "\n"]
    shown = [r for r in result["rows"] if r["verdict"] in ("regressed", "missing now")]
    rest = [r for r in result["rows"] if r["verdict"] not in ("regressed", "missing now")]
    shown += rest[:max(0, top - len(shown))] if len(shown) < top else []
    lines += [f"## Worst first ({len(shown)} of {result['compared']})\n", *_md_rows(shown), ""]
    if result["not_compared"]:
        lines += ["## Not compared\n", *(f"- {s}" for s in result["not_compared"]), ""]
    lines += [f"<details><summary>All {result['compared']} compared metrics</summary>\n",
              *_md_rows(result["rows"]), "", "</details>", ""]
    return "\n".join(lines)


def _fmt_count(v) -> str:
    return f"{v:,}" if isinstance(v, int) else "—"


def _fmt_rate(v) -> str:
    return f"{v:.4f}" if isinstance(v, float) else "—"


def write_regression(result: dict, out_dir: str | Path) -> tuple[Path, Path]:
    """regression.json and regression.md in ``out_dir`` (each written beside, then renamed)."""
    out = Path(out_dir)
    texts = {"regression.json": json_text(result), "regression.md": to_markdown(result)}
    try:
        out.mkdir(parents=True, exist_ok=True)
        # both written beside, then both renamed (the markdown first, on leaving the inner block)
        with atomic_path(out / "regression.json") as tmp_json, atomic_path(out / "regression.md") as tmp_md:
            tmp_json.write_text(texts["regression.json"])
            tmp_md.write_text(texts["regression.md"])
    except OSError as exc:
        raise ConfigError(f"Cannot write the regression report into {out}: {exc.strerror or exc}.") from None
    return out / "regression.json", out / "regression.md"


def remove_stale(out_dir: str | Path) -> None:
    """A regression report left from an earlier comparison no longer describes what is in the folder."""
    for name in ("regression.json", "regression.md"):
        p = Path(out_dir) / name
        if p.is_file():
            p.unlink()
