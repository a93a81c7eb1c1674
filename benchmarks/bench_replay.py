"""The Adaptive Verification replay on the demo run: the compiled loops against the per-step numpy
reference, side by side.

    python benchmarks/bench_replay.py [--source runs/demo] [--costs FILE] [--repeats 3]

The trace is what `svt evaluate --costs` replays: every request-step of the run with each lossless
probability feature as a predictor (q_max and the others), K confidences per step; the replay
covers every policy (fixed K = 0..K, AV on the convex and the engine rule, AV + draft length, the
oracle) at the seven default concurrencies. Both paths must give the same points (checked here,
bit for bit). Results go to reports/bench/replay.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import polars as pl
from rich.console import Console

from svt.features import FEATURES
from svt.simulate import build_trace, load_costs, replay
from svt.traces import open_run

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import fmt, ratios, rounds, summary  # noqa: E402


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--source", type=Path, default=ROOT / "runs" / "demo")
    ap.add_argument("--costs", type=Path, default=ROOT / "configs" / "costs" / "h100-llama8b-eagle.yaml")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=ROOT / "reports" / "bench" / "replay.json")
    args = ap.parse_args(argv)
    if not (args.source / "run.json").is_file():
        subprocess.run([sys.executable, "-m", "svt.cli", "collect", str(ROOT / "configs/collect/demo.yaml"),
                        "--out", str(args.source), "--overwrite", "--quiet"], check=True)
    drafts = open_run(args.source).uncensored_drafts().collect().with_columns(pl.lit(0).alias("_run"))
    drafts = drafts.filter(pl.col("label").is_not_null())
    preds = [f for f in FEATURES.values() if f.probability and f.lossless]
    frame = drafts.with_columns(*(f.expr.alias(f"_p{i}") for i, f in enumerate(preds)))
    trace = build_trace(frame, {f.name: f"_p{i}" for i, f in enumerate(preds)})
    costs = load_costs(args.costs)
    times, last = rounds({"reference": lambda: replay(trace, costs, engine_rule=True, compiled=False),
                          "compiled": lambda: replay(trace, costs, engine_rule=True)}, args.repeats)
    if last["reference"] != last["compiled"]:
        raise SystemExit("the compiled replay's points differ from the reference's")
    result = {"source": str(args.source), "costs": str(args.costs), "steps": int(trace.request.size),
              "predictors": [f.name for f in preds], "points": len(last["compiled"]),
              "reference_s": summary(times["reference"]), "compiled_s": summary(times["compiled"]),
              "speedup": ratios(times["reference"], times["compiled"])}
    Console().print(f"AV replay, {result['steps']:,} request-steps, predictors {', '.join(result['predictors'])}, "
                    f"{result['points']} points: "
                    f"reference {fmt(result['reference_s'], ' s')}, compiled {fmt(result['compiled_s'], ' s', 3)}, "
                    f"{fmt(result['speedup'], 'x', 0)} (identical points)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
