"""Can a user trust the cost profile's verdict? Profiles the demo pair N times on the machine as it
is, then N times with two processes spinning on the cores, and counts how often each was called
reliable (run.json-free: the table's own `measurement.reliable`), with each profile's largest
residual and widest interval. With ``--run RUN`` (a greedy or sampled demo run), each profile also
prices the replay of RUN and records its winner at each batch size (the best fixed K, AV and
AV+length policies by throughput) and how many of the profile's own refits agree: the decisions a
user acts on.

    python benchmarks/bench_profile_flag.py [--rounds 10] [--run RUN --fit FIT] [--busy 2]
    python benchmarks/bench_profile_flag.py --judge RUN   # the tables already profiled, against RUN

``--judge RUN`` profiles nothing: it replays RUN on every table the last run wrote and reports, per
table, the decision audit over its own refits, and, across the quiet tables, how the winner at each
batch size changes from profile to profile and what following one profile's pick gives up under
another's table (reports/bench/profile_judge.json): the variation the refits do not cover.

Results go to reports/bench/profile_flag.json and profile_flag.md. Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SVT = [sys.executable, "-m", "svt.cli"]


def profile(out: Path) -> dict:
    t0 = time.perf_counter()
    r = subprocess.run([*SVT, "collect", str(ROOT / "configs" / "collect" / "demo.yaml"), "--profile-costs",
                        "--out", str(out), "--quiet", "--overwrite"], capture_output=True, text=True, cwd=ROOT)
    if r.returncode:
        raise SystemExit(f"profile failed:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    import yaml

    m = yaml.safe_load(out.read_text())["measurement"]
    fit = m.get("fit") or {}
    return {"seconds": round(time.perf_counter() - t0, 1), "reliable": bool(m.get("reliable")),
            "warnings": m.get("warnings", []), "max_residual": fit.get("max_residual"),
            "max_uncertainty": fit.get("max_uncertainty"), "load_after": m.get("load_1min_after")}


def decisions(run: str, fit: str | None, costs: Path) -> list[dict]:
    from svt.report import EvaluateOptions, evaluate

    rep = evaluate([run], EvaluateOptions(features=["q_max"], fits=[fit] if fit else [], costs=str(costs)))
    return ((rep.get("simulation") or {}).get("costs") or {}).get("decisions", [])


def judge(run: str, work: Path) -> dict:
    import numpy as np

    from svt.report import EvaluateOptions, evaluate
    from svt.simulate.av import winners

    audits, quiet_points = [], []
    for state in ("quiet", "busy"):
        for costs in sorted(work.glob(f"{state}-*.yaml"), key=lambda c: int(c.stem.split("-")[1])):
            sim = evaluate([run], EvaluateOptions(features=["q_max"], costs=str(costs)))["simulation"]
            audits.append({"table": costs.name, "flagged": bool(sim["costs"]["warnings"]),
                           "in_doubt": [d["concurrency"] for d in sim["costs"]["decisions"] if d["in_doubt"]],
                           "decisions": len(sim["costs"]["decisions"])})
            if state == "quiet":
                quiet_points.append(sim["points"])
            print(json.dumps(audits[-1]), flush=True)
    across = {}
    for b in sorted({int(p["concurrency"]) for p in quiet_points[0]}):
        picks = [winners(pts)[b] for pts in quiet_points]
        regrets = []
        for i, w in enumerate(picks):
            for j, pts in enumerate(quiet_points):
                if i != j:
                    thr = {p["policy"]: p["throughput"] for p in pts if p["concurrency"] == b and p["policy"] != "oracle"}
                    regrets.append((max(thr.values()) - thr[w]) / max(thr.values()))
        across[b] = {"winners": {w: picks.count(w) for w in sorted(set(picks))},
                     "median_regret": float(np.median(regrets)) if regrets else 0.0,
                     "max_regret": float(max(regrets, default=0.0))}
        print(b, json.dumps(across[b]), flush=True)
    return {"run": run, "tables": audits, "across_quiet_profiles": across}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--judge", metavar="RUN", help="replay RUN on the tables already profiled; profile nothing")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--busy", type=int, default=2, help="spinning processes in the busy half")
    ap.add_argument("--run")
    ap.add_argument("--fit")
    args = ap.parse_args()
    work = ROOT / "runs" / "bench-profile-flag"
    work.mkdir(parents=True, exist_ok=True)
    if args.judge:
        out = ROOT / "reports" / "bench"
        out.mkdir(parents=True, exist_ok=True)
        (out / "profile_judge.json").write_text(json.dumps(judge(args.judge, work), indent=1))
        return
    rows = []
    for state in ("quiet", "busy"):
        spinners = []
        if state == "busy":
            spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
            time.sleep(2)
        try:
            for i in range(args.rounds):
                costs = work / f"{state}-{i}.yaml"
                row = {"state": state, "round": i, **profile(costs)}
                if args.run and state == "quiet":
                    row["decisions"] = decisions(args.run, args.fit, costs)
                rows.append(row)
                print(json.dumps({k: v for k, v in row.items() if k != "warnings"}), flush=True)
        finally:
            for p in spinners:
                p.kill()
    out = ROOT / "reports" / "bench"
    out.mkdir(parents=True, exist_ok=True)
    (out / "profile_flag.json").write_text(json.dumps(rows, indent=1))
    quiet = [r for r in rows if r["state"] == "quiet"]
    busy = [r for r in rows if r["state"] == "busy"]
    lines = ["# Cost profile verdicts", "",
             f"- quiet machine: reliable in {sum(r['reliable'] for r in quiet)} of {len(quiet)}",
             f"- {args.busy} processes spinning: flagged in {sum(not r['reliable'] for r in busy)} of {len(busy)}", "",
             "| state | round | s | reliable | largest residual | widest interval | decisions in doubt |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        doubt = "; ".join(f"B={d['concurrency']}: {d['winner']} in {d['agree']}/{d['refits']}"
                          for d in r.get("decisions", []) if d.get("in_doubt")) or ("—" if "decisions" in r else "")
        lines.append(f"| {r['state']} | {r['round']} | {r['seconds']} | {r['reliable']} | {r['max_residual']} | "
                     f"{r['max_uncertainty']} | {doubt} |")
    (out / "profile_flag.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
