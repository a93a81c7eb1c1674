"""`svt evaluate --cluster local:2` at scale: time and peak memory per worker against the run's size.

    python benchmarks/bench_cluster.py [--labelled 1e7,1e8] [--feature q_max] [--workers 2] [--compare-up-to 1e8]

(``make bench`` runs the default sizes; ``--labelled 1e7,1e8,3e8`` adds the 3e8 run, about 14 GB on
disk and 8 minutes to write.)

Each run is synthetic (`python -m svt.traces.synthetic`: whole steps of the demo run resampled into
about N labelled drafts, written shard by shard; made once and reused). Each evaluation runs as its
own process; the figures are its wall time, the cluster's own time (start to close), each worker's
peak resident memory (its high-water mark, from the worker) and the driver's (``ru_maxrss`` of the
command and the largest process under it). Up to ``--compare-up-to`` labelled drafts the
single-machine report of the same feature is computed too, and the two are compared (counts and
AUCs exact, float sums to 1e-12).

Results are printed and written to reports/bench/cluster.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_scale import measure as run_cmd  # noqa: E402  (wall seconds and peak RSS of a child process)


def synthetic(source: Path, n: int) -> Path:
    run = ROOT / "runs" / f"synth-{n // 1_000_000}m"
    if not (run / "run.json").is_file():
        subprocess.run([sys.executable, "-m", "svt.traces.synthetic", str(source), str(run), "--labelled", str(n)],
                       cwd=ROOT, check=True)
    return run


def compare(cluster: dict, single: dict, feature: str) -> dict:
    """The largest differences between the cluster's and the single machine's figures."""
    a, b = cluster["features"][feature], single["features"][feature]
    scopes = [(a, b), (a["excluding_first"], b["excluding_first"]),
              *[(a["per_position"][str(j)], b["per_position"][str(j)]) for j in b["per_position"]]]
    out = {"counts_equal": all(x["n"] == y["n"] for x, y in scopes),
           "auc_max_abs_diff": max(abs(x["auc"] - y["auc"]) for x, y in scopes)}
    for m in ("log_loss", "brier", "ece", "ece_mass", "mean_pred"):
        diffs = [abs(x[m] - y[m]) / max(abs(y[m]), 1e-300) for x, y in scopes if x.get(m) is not None]
        if diffs:
            out[f"{m}_max_rel_diff"] = max(diffs)
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--source", type=Path, default=ROOT / "runs" / "demo")
    ap.add_argument("--labelled", default="1e7,1e8")
    ap.add_argument("--compare-up-to", type=float, default=1e8)
    ap.add_argument("--feature", default="q_max")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--engine", default="dask", help="dask (default) or ray (pip install 'svt[cluster-ray]')")
    ap.add_argument("--out", type=Path, default=ROOT / "reports" / "bench" / "cluster.json")
    args = ap.parse_args(argv)
    svt = str(Path(sys.executable).parent / "svt")
    sizes = sorted(int(float(x)) for x in args.labelled.split(","))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in sizes:
            run = synthetic(args.source, n)
            out = Path(tmp) / f"c{n}"
            wall, driver = run_cmd([svt, "evaluate", str(run), "--out", str(out), "--feature", args.feature,
                                    "--cluster", f"local:{args.workers}", "--cluster-engine", args.engine])
            rep = json.loads((out / "report.json").read_text())
            meta = json.loads((run / "run.json").read_text())
            row = {"labelled": rep["features"][args.feature]["n"], "drafts": meta["counts"]["drafts"],
                   "shards": rep["cluster"]["shards"], "wall_s": round(wall, 1),
                   "cluster_s": rep["cluster"]["seconds"], "worker_peak_gib": rep["cluster"]["worker_peak_gib"],
                   "driver_peak_gib": round(driver, 3)}
            if n <= args.compare_up_to:
                single = Path(tmp) / f"s{n}"
                s_wall, s_peak = run_cmd([svt, "evaluate", str(run), "--out", str(single), "--feature", args.feature])
                row["single_machine"] = {"wall_s": round(s_wall, 1), "peak_gib": round(s_peak, 3),
                                         **compare(rep, json.loads((single / "report.json").read_text()),
                                                   args.feature)}
            rows.append(row)
            print(json.dumps(row))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = {"feature": args.feature, "workers": args.workers, "engine": args.engine, "rows": rows,
              "machine": {"cores": os.cpu_count()}}
    args.out.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
