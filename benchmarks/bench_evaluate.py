"""Evaluation speed on 4.5 million labelled drafts, against scikit-learn on the same data.

    python benchmarks/bench_evaluate.py [--source runs/demo] [--n 4500000]

The drafts are resampled (whole steps) from a real run of the tiny pair (`svt.traces.synthetic`;
the demo run by default, collected first if missing). Side by side, in one process:

- ``svt, one feature``: AUC, log-loss, ECE (equal-width and equal-mass), Brier, mean prediction,
  overall, per position and excluding the first position, for q_max (`svt.metrics.ordered`);
- ``sklearn, one feature``: `roc_auc_score` + `log_loss` overall, per position (a loop) and
  excluding the first — fewer metrics than the svt path;
- the same two on **distinct scores**: q_max plus a uniform jitter of +-5e-8 in float64. A resampled
  table repeats its source's values (the demo run has ~10^5 distinct q_max), and sorts of
  repeated values are cheaper; this pair measures the case of real logs, where nearly every score
  is distinct and not a float32 value (svt's slowest path: float32 rounding merges scores that
  must be re-sorted by the float64 value);
- ``svt, full table``: every built-in feature of the default table with soft-label variants
  (`svt.report.scoring`'s feature table), as `svt evaluate` computes it.

Results are printed and written to reports/bench/evaluate.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
from rich.console import Console
from rich.table import Table
from sklearn.metrics import log_loss, roc_auc_score

from svt.features import DEFAULT_FEATURES, get_feature
from svt.metrics.ordered import score_tables
from svt.report.scoring import EvaluateOptions, features_table
from svt.traces import open_run
from svt.traces.synthetic import resample_steps

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from timing import fmt, ratios, rounds, summary  # noqa: E402


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--source", type=Path, default=ROOT / "runs" / "demo")
    ap.add_argument("--n", type=int, default=4_500_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=ROOT / "reports" / "bench" / "evaluate.json")
    args = ap.parse_args(argv)
    if not (args.source / "run.json").is_file():
        subprocess.run([sys.executable, "-m", "svt.cli", "collect", str(ROOT / "configs/collect/demo.yaml"),
                        "--out", str(args.source), "--overwrite", "--quiet"], check=True)
    src = open_run(args.source).scan("drafts").collect()
    drafts = resample_steps(src, args.n, seed=0)
    labelled = drafts.filter(pl.col("label").is_not_null()).with_columns(pl.col("request").alias("_req"))
    n = labelled.height
    y = labelled["label"].to_numpy().astype(np.float64)
    q = labelled["q_max"].to_numpy().astype(np.float64)
    pos = labelled["position"].to_numpy()

    rng = np.random.default_rng(0)
    q_distinct = np.clip(q + rng.uniform(-5e-8, 5e-8, q.size), 0.0, 1.0)

    def svt_one(q=q):
        return score_tables(q, y, pos, probability=True)

    def sk_one(q=q):
        out = {"overall": (roc_auc_score(y, q), log_loss(y, q))}
        m = pos > 0
        out["excluding_first"] = (roc_auc_score(y[m], q[m]), log_loss(y[m], q[m]))
        for k in np.unique(pos):
            mk = pos == k
            out[int(k)] = (roc_auc_score(y[mk], q[mk]), log_loss(y[mk], q[mk]))
        return out

    feats = [get_feature(f) for f in DEFAULT_FEATURES]
    times, last = rounds({"sklearn": sk_one, "svt": svt_one,
                          "full": lambda: features_table(labelled, feats, EvaluateOptions()),
                          "sklearn_distinct": lambda: sk_one(q_distinct),
                          "svt_distinct": lambda: svt_one(q_distinct)}, args.repeats)

    def diff(res_svt, res_sk):
        return max(abs(res_svt["overall"]["auc"] - res_sk["overall"][0]),
                   abs(res_svt["overall"]["log_loss"] - res_sk["overall"][1]),
                   *(abs(res_svt["per_position"][k]["auc"] - res_sk[k][0]) for k in res_svt["per_position"]))

    max_diff = max(diff(last["svt"], last["sklearn"]), diff(last["svt_distinct"], last["sklearn_distinct"]))
    t_sk, t_svt, t_full = summary(times["sklearn"]), summary(times["svt"]), summary(times["full"])
    t_sk_d, t_svt_d = summary(times["sklearn_distinct"]), summary(times["svt_distinct"])
    speedup = ratios(times["sklearn"], times["svt"])
    speedup_d = ratios(times["sklearn_distinct"], times["svt_distinct"])
    table = Table("path", "seconds: median (range)", title=f"evaluation on {n:,} labelled drafts "
                                                            f"({args.repeats} rounds, side by side)")
    table.add_row("sklearn, one feature (AUC + log-loss; overall, per position, excl. first)", fmt(t_sk))
    table.add_row("svt, one feature (AUC, log-loss, 2 ECEs, Brier; same scopes)", fmt(t_svt))
    table.add_row(f"svt, full table ({len(feats)} features + soft labels)", fmt(t_full))
    table.add_row("sklearn, one feature, distinct scores", fmt(t_sk_d))
    table.add_row("svt, one feature, distinct scores", fmt(t_svt_d))
    Console(width=200).print(table)  # off a terminal too: no wrapped cells
    print(f"one feature, svt vs sklearn: {fmt(speedup, 'x', 1)}; on distinct scores: {fmt(speedup_d, 'x', 1)}; "
          f"largest |svt - sklearn| = {max_diff:.2e}")
    result = {"labelled_drafts": n, "repeats": args.repeats,
              "seconds": {"sklearn_one_feature": t_sk, "svt_one_feature": t_svt, "svt_full_table": t_full,
                          "sklearn_one_feature_distinct": t_sk_d, "svt_one_feature_distinct": t_svt_d},
              "speedup_vs_sklearn": speedup, "speedup_vs_sklearn_distinct": speedup_d,
              "max_abs_diff": max_diff, "features_in_full_table": len(feats)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
