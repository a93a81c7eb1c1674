"""Writing a report: report.json (machine-readable) and report.md (tables readable on GitHub)."""

from __future__ import annotations

import os
from pathlib import Path

from svt.errors import ConfigError, DataError
from svt.fileio import json_text, read_json, write_text_atomic
from svt.report.sections import SECTIONS
from svt.report.text import DIRECTION_NOTE


def to_markdown(report: dict) -> str:
    """report.md: a header, then each section's part in order."""
    if report.get("kind") == "cache-only":
        return _cache_only_markdown(report)
    if report.get("kind") == "trees":
        from svt.report.trees_text import tree_markdown

        return tree_markdown(report)
    runs = ", ".join(f"`{r['run']}`" for r in report["runs"])
    sampling = report["runs"][0].get("sampling") or {}
    lines = ["# svt evaluation report\n",
             f"Runs: {runs}. Sampling: temperature {_recorded(sampling.get('temperature'))}, top-p "
             f"{_recorded(sampling.get('top_p'))}. svt {report['svt_version']}, {report['created']}.\n",
             f"Labelled drafts: {report['acceptance']['labelled']:,}; acceptance rate "
             f"{report['acceptance']['rate']:.4f}; mean acceptance length (incl. the bonus token) "
             f"{report['acceptance']['mean_acceptance_length']:.3f}.\n",
             "Metrics on hard labels (drafts with a label). `—` = undefined: log-loss, ECE and Brier "
             "need a probability (features marked *probability: no* need a fitted predictor); AUC "
             "needs both classes. ECE: 10 equal-width bins; ece_mass: 10 equal-mass bins. Brackets: 95% request-level bootstrap "
             "intervals. " + DIRECTION_NOTE + "\n"]
    lines += reading_lines(report) + fit_lines(report)
    for r in report["runs"]:
        imp = r.get("import")
        if imp:  # an imported trace: where it came from and what it cannot give
            cannot = "; ".join(imp.get("cannot_study") or [])
            lines.append(f"`{r['run']}` is imported ({imp.get('format')}, from `{imp.get('source')}`); it lacks "
                         + "; ".join(f"{t} {', '.join(c)}" for t, c in (imp.get("lacks") or {}).items())
                         + (f". Cannot study {cannot}." if cannot else ".") + "\n")
    for section in SECTIONS:
        lines += section.markdown(report)
    return "\n".join(lines) + "\n"


def _cache_only_markdown(report: dict) -> str:
    """report.md of runs without model drafts: their cache, yield, HVD, realism and figures."""
    runs = ", ".join(f"`{r['run']}`" for r in report["runs"])
    lines = ["# svt evaluation report (cache drafts only)\n",
             f"Runs: {runs}. svt {report['svt_version']}, {report['created']}.\n",
             f"**{report['note']}**\n"]
    for info, drafter in zip(report["runs"], report.get("drafters") or [], strict=False):
        who = f"`{info['run']}`: " if len(report["runs"]) > 1 else ""
        if drafter.get("kind") == "stand-in":
            lines.append(f"{who}Model drafter: **a stand-in** (conditional acceptance by position "
                         f"{', '.join(f'{a:.3f}' for a in drafter['accept'])}, {drafter['source']}; "
                         f"{drafter['tokens_per_cycle']:.2f} tokens per cycle expected). {drafter['note']}.\n")
        elif drafter.get("kind") in ("model", "head"):
            lines.append(f"{who}Model drafter: `{drafter['path']}`, {drafter['note']}.\n")
    lines += reading_lines(report)
    for section in SECTIONS:
        if section.name in CACHE_ONLY:
            lines += section.markdown(report)
    return "\n".join(lines) + "\n"


def fit_lines(report: dict) -> list[str]:
    """Each fitted predictor in the report, with what it was scored on (held-out requests, requests
    left out, requests scored unverified)."""
    out = []
    for name, f in (report.get("features") or {}).items():
        desc = f.get("description") or ""
        if desc.startswith("fitted predictor "):
            out.append(f"- `{name}`: {desc}\n")
    if not out:
        return []
    head = "Fitted predictors:\n"
    if (report.get("settings") or {}).get("score_unverified"):
        head = ("Fitted predictors (**--score-unverified**: requests whose held-out status svt could not verify are "
                "scored; a fit's figures may include its own training requests):\n")
    return [head, *out]


def reading_lines(report: dict) -> list[str]:
    """How each run's workloads were read (run.json's ``workload_reading``): chat turns, rows
    skipped for want of a reference, and requests that repeat a row (their answers were already in
    a suffix cache's global tree)."""
    out = []
    for r in report["runs"]:
        w = r.get("workload_reading")
        if not w:
            continue
        who = f"`{r['run']}`: " if len(report["runs"]) > 1 else ""
        turns = ", ".join(f"{n} {t}" for n, t in (w.get("turns") or {}).items())
        taken = w.get("requests_per_workload") or {}
        prompts = w.get("prompts") or {}
        parts = [f"{w.get('requests', 0):,} requests"
                 + (f" ({', '.join(f'{n} {c:,}' for n, c in taken.items())})" if taken else "")
                 + f" from the workloads' {sum(prompts.values()):,} prompts "
                 f"({', '.join(f'{n} {c:,}' for n, c in prompts.items())}); chat turns: {turns}"]
        skipped = {n: c for n, c in (w.get("skipped_no_reference") or {}).items() if c}
        if skipped:
            parts.append("skipped for want of a reference: " + ", ".join(f"{n} {c:,}" for n, c in skipped.items()))
        long = {n: c for n, c in (w.get("skipped_long_head") or {}).items() if c}
        if long:
            parts.append("skipped for a head longer than max_prompt_tokens (`on_long_head: skip`): "
                         + ", ".join(f"{n} {c:,}" for n, c in long.items()))
        opening = {n: c for n, c in (w.get("assistant_turns_without_prompt") or {}).items() if c}
        if opening:
            parts.append("assistant turns that open a conversation, not requests (nothing before them): "
                         + ", ".join(f"{n} {c:,}" for n, c in opening.items()))
        if w.get("repeated_requests"):
            cached = (r.get("counts") or {}).get("cache_drafts")
            parts.append(f"**{w['repeated_requests']:,} requests repeat a row** (`repeat: true`)"
                         + (": their answers were already in the suffix cache's global tree, which raises its yield"
                            if cached else ""))
        out.append(f"{who}Workloads: " + "; ".join(parts) + ".\n")
    return out


# the sections a report of runs without model drafts has
CACHE_ONLY = ("yield and HVD replay", "realism", "figures")


def link_figures(report_dir: str | Path, figures: list[Path], related: list[str | Path] = ()) -> None:
    """Record the figures (and other reports, with their figures) in report.json and re-render
    report.md with a Figures section."""
    report_dir = Path(report_dir)
    report = read_json(report_dir / "report.json", "Report")
    report["figures"] = [str(Path(f).relative_to(report_dir)) for f in figures]
    rel = []
    for other in related:
        other = Path(other)
        if not (other / "report.json").is_file():
            raise DataError(f"{other}: not a report directory (no report.json) to link.")
        figs = read_json(other / "report.json", "Report").get("figures") or []
        rel.append({"report": os.path.relpath(other / "report.md", report_dir),
                    "figures": [os.path.relpath(other / f, report_dir) for f in figs]})
    report["related"] = rel
    write_report(report, report_dir)


def check_report_out(out_dir: str | Path, *, overwrite: bool) -> None:
    """``svt evaluate --out``: a new or report folder (fits, figures and cost tables may sit
    beside a report); an existing report is replaced only with ``--overwrite``, and a folder that
    is a run (or another tool's table folder) never."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{out} is a file; --out takes a report directory.")
    if not out.is_dir():
        return
    if (out / "run.json").exists() or any((out / t).is_dir() and any((out / t).glob("*.parquet"))
                                          for t in ("drafts", "steps", "requests", "cache_drafts")):
        raise ConfigError(f"{out} is a run directory; write the report elsewhere (--out reports/NAME).")
    if (out / "report.json").exists() and not overwrite:
        raise ConfigError(f"{out} already holds a report (report.json); pass --overwrite to replace it.")


def write_report(report: dict, out_dir: str | Path) -> tuple[Path, Path]:
    """report.json and report.md, each written to a temporary name and renamed."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{out} is a file; --out takes a report directory.")
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, text in (("report.json", json_text(report)),
                       ("report.md", to_markdown(report))):
        paths.append(write_text_atomic(out / name, text))
    return paths[0], paths[1]


def _recorded(value) -> str:
    return "not recorded" if value is None else str(value)
