"""Speed regressions caught in CI: the benchmarks' ratios against a committed baseline.

    python benchmarks/bench_check.py            # check (exit 1 when a ratio fell)
    python benchmarks/bench_check.py --update   # measure and write the baseline (deliberately)

Absolute times move with the machine; a ratio of two contenders timed side by side in one process
(svt against scikit-learn on the same drafts) moves much less, so it is what is checked. Each check
runs a benchmark at a CI size (1 million drafts instead of 4.5 million, more rounds) and reads the
median of its per-round ratios. A ratio more than ``--tolerance`` (15 %) below the baseline's is
measured once more before it is called a regression (a busy moment of a shared machine hits one
run, not two in a row); both runs are reported. The baseline is ``benchmarks/baseline.json``, with
the machine it was measured on; refresh it with ``--update`` (or ``make bench-baseline``) when a
change is meant to move a ratio, and say so in the commit.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
BASELINE = ROOT / "benchmarks" / "baseline.json"
SOURCE = ROOT / "runs" / "bench-check-source"
TOLERANCE = 0.15
N = 1_000_000
REPEATS = 5

# name -> (benchmark module, its arguments, the result key of the ratio)
CHECKS = {
    "evaluate: one feature, svt vs scikit-learn": ("bench_evaluate", [], "speedup_vs_sklearn"),
    "evaluate: distinct scores, svt vs scikit-learn": ("bench_evaluate", [], "speedup_vs_sklearn_distinct"),
    "fit: online IRLS replay vs scikit-learn": ("bench_fit", [], "speedup_online_vs_sklearn"),
}


def _source() -> Path:
    """A small real run of the built-in pair to resample drafts from (collected once)."""
    if not (SOURCE / "run.json").is_file():
        subprocess.run([sys.executable, "-m", "svt.cli", "collect", str(ROOT / "configs/collect/demo.yaml"),
                        "--out", str(SOURCE), "--overwrite", "--quiet", "--set", "requests=24",
                        "--set", "log.hidden=false", "--set", "log.dists_fraction=0"], check=True)
    return SOURCE


def measure(modules: set[str] | None = None) -> dict[str, float]:
    """Each check's median ratio (the benchmarks of ``modules`` only, when given), one run each."""
    import importlib

    source, results = _source(), {}
    for module in dict.fromkeys(m for m, _, _ in CHECKS.values()):
        if modules is not None and module not in modules:
            continue
        out = ROOT / "reports" / "bench" / f"check-{module}.json"
        results[module] = importlib.import_module(module).main(
            ["--source", str(source), "--n", str(N), "--repeats", str(REPEATS), "--out", str(out)])
    return {name: float(results[m][key]["median"]) for name, (m, _, key) in CHECKS.items() if m in results}


def machine() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"cpu": cpu, "cores": os.cpu_count()}


UPDATE_RUNS = 3  # the baseline is the median of this many runs (one run's ratio moves by up to ~13 %)


def judge(now: dict[str, float], base: dict[str, float], tolerance: float) -> dict[str, bool]:
    """Per check: whether its ratio fell more than ``tolerance`` below the baseline's."""
    return {name: now[name] < (1.0 - tolerance) * base[name] for name in now if name in base}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--update", action="store_true", help="write the measured ratios as the baseline")
    ap.add_argument("--tolerance", type=float, default=TOLERANCE)
    args = ap.parse_args(argv)
    if not 0 < args.tolerance < 1:
        ap.error("--tolerance must be in (0, 1).")
    if args.update:
        runs = [measure() for _ in range(UPDATE_RUNS)]
        now = {k: float(sorted(r[k] for r in runs)[len(runs) // 2]) for k in runs[0]}
        BASELINE.write_text(json.dumps({"ratios": now, "runs": runs, "machine": machine(), "drafts": N,
                                        "repeats": REPEATS, "tolerance": args.tolerance}, indent=2) + "\n")
        print(f"wrote {BASELINE}: " + "; ".join(f"{k} {v:.1f}x" for k, v in now.items()))
        return 0
    try:
        record = json.loads(BASELINE.read_text())
        base = record["ratios"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
        print(f"error: {BASELINE}: no baseline of ratios ({exc}); write one with --update.", file=sys.stderr)
        return 2
    if record.get("machine") and record["machine"] != machine():  # another CPU: ratios differ by more than noise
        args.tolerance = min(2 * args.tolerance, 0.5)
        print(f"the baseline was measured on {record['machine']}, this is {machine()}: judged at a tolerance of "
              f"{args.tolerance:.0%} (refresh it here with `make bench-baseline` to judge at 15 %)")
    now = measure()
    fell = judge(now, base, args.tolerance)
    again: dict[str, float] = {}
    if any(fell.values()):  # measured once more: a regression is one that holds in two runs in a row
        again = measure({CHECKS[n][0] for n, f in fell.items() if f})
        fell = {n: f and judge({n: again[n]}, base, args.tolerance)[n] for n, f in fell.items()}
    for name in CHECKS:
        if name not in base or name not in now:
            print(f"  {name}: not in the baseline (--update to add it)")
            continue
        second = f", again {again[name]:.1f}x" if name in again else ""
        verdict = "FELL" if fell.get(name) else "ok"
        print(f"  {verdict:4s} {name}: {now[name]:.1f}x{second} against the baseline's {base[name]:.1f}x "
              f"(floor {(1 - args.tolerance) * base[name]:.1f}x)")
    if any(fell.values()):
        print(f"speed regression: {sum(fell.values())} ratio(s) more than {args.tolerance:.0%} below the baseline "
              "in two runs in a row.", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
