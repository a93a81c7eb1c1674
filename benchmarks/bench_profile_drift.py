"""Does one point's replay hold still from one fresh cost profile to the next? Profiles the demo pair
in fresh processes, rounds apart, and replays one trace on every table: per table, the replay's
decode tokens/s at each (fixed K, B) and each K's tokens/s over plain decoding's (K = 0) at the same
B (the comparison a decision rests on), with the profile's own drift record (how much its
interleaved passes' wall-clock moved). Across the tables: the median and the range of each, as
(max - min) / median. Several ``--variant NAME=PYTHONPATH`` alternate round by round (another
checkout's profiler against this one, the machine's drift shared).

    python benchmarks/bench_profile_drift.py --trace RUN [--rounds 5] [--k 3] [--batches 1,8,16]
        [--variant old=/path/to/old/toolkit]

RUN: a run of configs/collect/demo.yaml at K = --k (e.g. one of `bench_live.py`'s). Results go to
reports/bench/profile_drift.json and .md. Run it on a quiet machine: it measures wall-clock.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def profile(out: Path, k: int, batches: str, requests: int, tokens: int, pythonpath: str | None) -> float:
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "svt.cli", "collect", str(ROOT / "configs" / "collect" / "demo.yaml"),
                        "--profile-costs", "--out", str(out), "--profile-batches", batches, "--set", f"k={k}",
                        "--set", f"requests={requests}", "--set", f"max_new_tokens={tokens}", "--quiet",
                        "--overwrite"], capture_output=True, text=True, cwd=ROOT, env=env)
    if r.returncode:
        raise SystemExit(f"profile failed:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    return time.perf_counter() - t0


def replay(trace: str, costs: Path, ks: list[int], batches: list[int]) -> dict:
    from svt.report import EvaluateOptions, evaluate

    sim = evaluate([trace], EvaluateOptions(features=["q_max"], costs=str(costs),
                                            concurrency=tuple(batches)))["simulation"]
    thr = {(p["policy"], int(p["concurrency"])): float(p["throughput"]) for p in sim["points"]}
    out = {}
    for b in batches:
        for k in ks:
            out[f"K={k}, B={b}"] = thr[(f"fixed K={k}", b)]
            if k:
                out[f"K={k} / K=0, B={b}"] = thr[(f"fixed K={k}", b)] / thr[("fixed K=0", b)]
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--trace", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--batches", default="1,8,16")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--variant", action="append", default=[], help="NAME=PYTHONPATH (default: this checkout)")
    ap.add_argument("--work", type=Path, default=ROOT / "runs" / "bench-profile-drift")
    ap.add_argument("--out", type=Path, default=ROOT / "reports" / "bench" / "profile_drift.json")
    args = ap.parse_args(argv)
    variants = [v.split("=", 1) for v in args.variant] or [["this", ""]]
    batches = [int(x) for x in args.batches.split(",")]
    ks = sorted({0, 1, args.k})
    prof_batches = ",".join(str(b) for b in sorted({1, 2, 4, *batches}))
    args.work.mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(args.rounds):
        for name, path in variants:
            costs = args.work / f"{name}-{i}.yaml"
            secs = profile(costs, args.k, prof_batches, args.requests, args.tokens, path or None)
            import yaml

            m = yaml.safe_load(costs.read_text())["measurement"]
            rows.append({"variant": name, "round": i, "seconds": round(secs, 1), "reliable": bool(m.get("reliable")),
                         "drift": m.get("drift"), "values": replay(args.trace, costs, ks, batches)})
            print(json.dumps(rows[-1]), flush=True)
    summary = {}
    for name, _ in variants:
        rs = [r for r in rows if r["variant"] == name]
        summary[name] = {}
        for key in rs[0]["values"]:
            v = np.array([r["values"][key] for r in rs])
            med = float(np.median(v))
            summary[name][key] = {"median": med, "min": float(v.min()), "max": float(v.max()),
                                  "range": float((v.max() - v.min()) / med)}
    result = {"config": vars(args) | {"work": str(args.work), "out": str(args.out), "trace": args.trace},
              "rows": rows, "summary": summary}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    names = [n for n, _ in variants]
    lines = ["| replayed | " + " | ".join(f"{n}: median [min-max], range" for n in names) + " |",
             "|---|" + "---|" * len(names)]
    for key in summary[names[0]]:
        cells = []
        for n in names:
            s = summary[n][key]
            d = 3 if "/" in key else 0
            cells.append(f"{s['median']:,.{d}f} [{s['min']:,.{d}f}-{s['max']:,.{d}f}], {s['range']:.0%}")
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    md = "\n".join(lines)
    args.out.with_suffix(".md").write_text(md + "\n")
    print(md)
    return result


if __name__ == "__main__":
    main()
