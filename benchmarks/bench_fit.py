"""Online IRLS replay against scikit-learn's LogisticRegression on 4.5 million labelled drafts.

    python benchmarks/bench_fit.py [--source runs/demo] [--n 4500000]

Drafts are resampled (whole steps) from a real run (`svt.traces.synthetic`). Side by side in one
process, on the same rows and the same design (logit(q_max) and one intercept per position):

- ``svt irls-online``: the full prequential replay (default options: a refit every 10 decode steps);
- ``svt logistic``: the offline Newton fit to convergence;
- ``sklearn``: ``LogisticRegression(C=inf, fit_intercept=False)`` (lbfgs) on the same design matrix.

It prints the times, the speed-up of the online replay over scikit-learn, and the largest
coefficient difference between svt's offline fit and scikit-learn's. Results go to
reports/bench/fit.json.
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
from sklearn.linear_model import LogisticRegression

from svt.features import get_feature
from svt.fit import IRLSOnline, OnlineOptions
from svt.fit.logistic import design, fit_newton
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
    ap.add_argument("--out", type=Path, default=ROOT / "reports" / "bench" / "fit.json")
    args = ap.parse_args(argv)
    if not (args.source / "run.json").is_file():  # the demo run is the source; collect it once
        subprocess.run([sys.executable, "-m", "svt.cli", "collect", str(ROOT / "configs/collect/demo.yaml"),
                        "--out", str(args.source), "--overwrite", "--quiet"], check=True)
    src = open_run(args.source)
    bs = int(src.meta["config"]["batch_size"])
    drafts = resample_steps(src.scan("drafts").collect(), args.n, seed=0)
    lab = drafts.filter(pl.col("label").is_not_null()).sort("request", "step", "position")
    # replay order: requests decoded in batches of the source's batch size, step by step
    lab = lab.with_columns((pl.col("request") // bs).alias("_b")).sort("_b", "step", "request", "position")
    lab = lab.with_columns(pl.struct("_b", "step").rank("dense").sub(1).alias("decode_step"))
    x = lab.select(get_feature("logit_qmax").expr.alias("x"))["x"].to_numpy()
    pos, y, step = lab["position"].to_numpy(), lab["label"].to_numpy().astype(float), lab["decode_step"].to_numpy()
    k = int(pos.max()) + 1

    X = design(x[:, None], pos, k, per_position_slope=False)
    times, last = rounds({
        "sklearn": lambda: LogisticRegression(C=np.inf, fit_intercept=False, tol=1e-10, max_iter=1000).fit(X, y),
        "online": lambda: IRLSOnline(OnlineOptions()).fit(x, pos, y, step, k=k),
        "newton": lambda: fit_newton(X, y),
    }, args.repeats)
    est, (beta, iters), ref = last["online"], last["newton"], last["sklearn"]
    diff = float(np.abs(beta - ref.coef_[0]).max())
    t_online, t_newton, t_sk = summary(times["online"]), summary(times["newton"]), summary(times["sklearn"])
    speedup = ratios(times["sklearn"], times["online"])
    n = len(y)
    table = Table("path", "seconds: median (range)", title=f"fitting on {n:,} labelled drafts "
                                                            f"({args.repeats} rounds, side by side)")
    table.add_row(f"svt irls-online (prequential replay, {len(est.path_):,} refits)", fmt(t_online))
    table.add_row(f"svt logistic (Newton, {iters} iterations)", fmt(t_newton))
    table.add_row("sklearn LogisticRegression (lbfgs)", fmt(t_sk))
    Console(width=200).print(table)  # off a terminal too: no wrapped cells
    print(f"online replay vs sklearn: {fmt(speedup, 'x', 1)}; max |svt logistic - sklearn| coef = {diff:.2e}")
    res = {"labelled_drafts": n, "repeats": args.repeats,
           "seconds": {"irls_online": t_online, "logistic_newton": t_newton, "sklearn": t_sk},
           "speedup_online_vs_sklearn": speedup, "max_coef_diff": diff, "refits": len(est.path_)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=2) + "\n")
    return res


if __name__ == "__main__":
    main()
