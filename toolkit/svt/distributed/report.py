"""``svt evaluate RUN --cluster ...``: the report a cluster computes (the features table, see
:mod:`svt.distributed.evaluate`), written as report.json and report.md beside what it leaves out."""

from __future__ import annotations

import time
from pathlib import Path

from svt.errors import ConfigError

#: single-machine sections --cluster does not compute yet: the option that asks for each
NOT_ON_CLUSTER = {"bootstrap": "--bootstrap (intervals)",
                  "costs": "--costs (the AV and HVD replays)", "live": "--live", "reference_run": "--reference-run",
                  "baseline": "--baseline (the regression report)", "feature_module": "--feature-module",
                  "replay_bootstrap": "--replay-bootstrap",
                  "seed": "--seed (the bootstrap's)", "tolerance": "--tolerance (the regression report's)",
                  "high_yield": "--high-yield (yield predictors)"}


def check_cluster_options(runs: list, bins: int, **asked) -> None:
    """One clear refusal naming every section --cluster cannot compute that the command asks for."""
    wanted = [NOT_ON_CLUSTER[k] for k, v in asked.items() if v and k in NOT_ON_CLUSTER]
    if bins < 1:
        raise ConfigError(f"Expected --bins >= 1, but got {bins}.")
    if wanted:
        raise ConfigError(f"--cluster computes the features table (overall, excluding the first position, per "
                          f"position; per run, per value of a drafts column with --by; row-wise fits with --fit); it does not compute {', '.join(wanted)} yet: run those on one machine "
                          "(without --cluster).")


def cluster_report(runs: list[Path], features: list[str], cluster: str, engine: str = "dask", by: str | None = None,
                   fits: list | None = None, score_unverified: bool = False, bins: int = 10) -> dict:
    from svt import __version__
    from svt.distributed.engines import start
    from svt.distributed.evaluate import features_table

    t0 = time.perf_counter()
    with start(cluster, engine) as eng:
        body = features_table(runs, features, eng, by=by, fits=fits, score_unverified=score_unverified, n_bins=bins)
    return {"report_schema": "svt-cluster-1", "svt_version": __version__, "runs": body.pop("runs"),
            "cluster": {"engine": engine, "spec": cluster, "workers": body.pop("workers"), "shards": body.pop("shards"),
                        "worker_peak_gib": body.pop("worker_peak_gib"),
                        "seconds": round(time.perf_counter() - t0, 3), "refined_bins": body.pop("refined_bins")},
            "exact": "counts, acceptance and AUC (two passes; auc_bound is what could remain, 0 after the refining "
                     "pass); log-loss, Brier, mean prediction, ECE (equal-width bins) and ece_mass (equal-mass bins, "
                     "the single machine's bins) are sums merged in another order than on one machine: equal "
                     "to rounding; the soft-label blocks' AUC is not refined: within its auc_bound (the weight of "
                     "pairs of distinct drafts inside a histogram bin, counted half), its sums equal to rounding",
            "roc_points": "exact points at thresholds between the histogram's bins, not the single machine's "
                          "thresholds",
            **body}


def to_markdown(report: dict) -> str:
    from svt.report.text import fmt, md_table

    c = report["cluster"]
    lines = [f"# svt report (cluster): {', '.join(r['path'] for r in report['runs'])}\n",
             f"Computed on a {c['engine']} cluster ({c['spec']}: {c['workers']} workers, {c['shards']} drafts shards, "
             f"{c['seconds']} s; peak memory per worker {', '.join(f'{x:.2f}' for x in c['worker_peak_gib'])} GiB). Exact: {report['exact']}. Not computed here: {'; '.join(report['not_computed'])}.\n"]
    head = ["scope", "drafts", "acceptance", "AUC", "AUC bound", "log-loss", "Brier", "ECE", "ECE (mass)"]

    def row(s, b):
        return [s, fmt(b["n"]), fmt(b["accept_rate"], 4), fmt(b["auc"], 4), f"{b['auc_bound']:.1e}",
                fmt(b.get("log_loss"), 4), fmt(b.get("brier"), 4), fmt(b.get("ece"), 4), fmt(b.get("ece_mass"), 4)]

    acc = report.get("acceptance")
    if acc:
        lines += [f"## Acceptance by draft position\n\nAcceptance {fmt(acc['rate'], 4)} of {fmt(acc['labelled'])} labelled "
                  f"drafts; mean acceptance length {fmt(acc['mean_acceptance_length'], 3)}.\n",
                  md_table(["position", "proposed", "verified", "accepted", "conditional", "marginal"],
                           [[str(r["position"]), fmt(r["proposed"]), fmt(r["verified"]), fmt(r["accepted"]),
                             fmt(r["conditional"], 4), fmt(r["marginal"], 4)] for r in acc["by_position"]]), ""]
    elif report.get("acceptance_not_computed"):
        lines += [f"Acceptance by position: not computed ({report['acceptance_not_computed']}).\n"]
    for name, f in report["features"].items():
        rows = [["all", f], ["excluding first", f["excluding_first"]],
                *[[f"position {j}", b] for j, b in f["per_position"].items()]]
        lines += [f"## {name}\n", *([f"{f['description']}.\n"] if f.get("description") else []),
                  md_table(head, [row(s, b) for s, b in rows]), ""]
    for by, values in (report.get("groups") or {}).items():  # per run, per value of --by
        for name in report["features"]:
            lines += [f"## {name} by {by}\n", md_table(head, [row(v, t[name]) for v, t in values.items() if name in t]), ""]
    return "\n".join(lines)


def write_cluster_report(report: dict, out_dir: Path) -> tuple[Path, Path]:
    import json

    from svt.fileio import write_text_atomic

    out_dir.mkdir(parents=True, exist_ok=True)
    j = write_text_atomic(out_dir / "report.json", json.dumps(report, indent=1, default=float))
    m = write_text_atomic(out_dir / "report.md", to_markdown(report))
    return j, m
