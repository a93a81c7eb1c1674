"""Scale: `svt evaluate` and `svt fit --model irls-online` on 100 million labelled drafts.

    python benchmarks/bench_scale.py [--labelled 1e8] [--repeats 3] [--run runs/synth-100m]

The run is synthetic (`python -m svt.traces.synthetic`): whole steps of the demo run resampled
with replacement into ~100 M labelled drafts (~245 M drafts with the never-verified ones), written
shard by shard; it is made once and reused (~2.5 min, ~6 GB on disk). Each command runs as its own
process, ``--repeats`` times; each figure is the median wall time and the median peak resident
memory (the process's high-water mark from the kernel, ``ru_maxrss`` of wait4) with their ranges.
The goal is a peak under 4 GB for each.

Results are printed and written to reports/bench/scale.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from timing import fmt, summary  # noqa: E402


def measure(cmd: list[str]) -> tuple[float, float]:
    """Wall seconds and peak RSS (GiB) of one command, run as a child process."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - t0
    err = proc.stderr.read().decode()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{err[-2000:]}")
    return seconds, usage.ru_maxrss / 2**20  # KiB on Linux


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--source", type=Path, default=ROOT / "runs" / "demo")
    ap.add_argument("--labelled", type=float, default=1e8)
    ap.add_argument("--run", type=Path, default=None, help="the synthetic run (made when missing)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only", choices=["evaluate", "fit"], default=None, help="measure one command only")
    ap.add_argument("--out", type=Path, default=ROOT / "reports" / "bench" / "scale.json")
    args = ap.parse_args(argv)
    n = int(args.labelled)
    run = args.run or ROOT / "runs" / f"synth-{n // 1_000_000}m"
    if not (args.source / "run.json").is_file():
        subprocess.run([sys.executable, "-m", "svt.cli", "collect", str(ROOT / "configs/collect/demo.yaml"),
                        "--out", str(args.source), "--overwrite", "--quiet"], check=True)
    made = None
    if not (run / "run.json").is_file():
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "svt.traces.synthetic", str(args.source), str(run),
                        "--labelled", str(n)], check=True)
        made = time.perf_counter() - t0
    meta = json.loads((run / "run.json").read_text())
    labelled = meta["synthetic"]["labelled"]
    drafts = sum(r["rows"] for r in meta["shards"]["drafts"].values())
    out_dir = ROOT / "reports" / "bench"
    cmds = {
        "evaluate": [sys.executable, "-m", "svt.cli", "evaluate", str(run), "--out", str(out_dir / "scale-evaluate"), "--overwrite"],
        "fit": [sys.executable, "-m", "svt.cli", "fit", str(run), "--model", "irls-online",
                "--out", str(out_dir / "scale-fit.json"), "--overwrite"],
    }
    res: dict = {"labelled_drafts": labelled, "drafts": drafts, "shards": len(meta["shards"]["drafts"]),
                 "repeats": args.repeats, "made_run_seconds": made}
    for name, cmd in cmds.items():
        if args.only and name != args.only:
            continue
        times, peaks = [], []
        for _ in range(args.repeats):
            s, gb = measure(cmd)
            times.append(s)
            peaks.append(gb)
        res[name] = {"seconds": summary(times), "peak_rss_gib": summary(peaks)}
        print(f"svt {name} on {labelled:,} labelled drafts ({drafts:,} drafts, {res['shards']} shards): "
              f"{fmt(res[name]['seconds'], ' s', 1)}, peak RSS {fmt(res[name]['peak_rss_gib'], ' GiB', 2)}",
              flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=2) + "\n")
    return res


if __name__ == "__main__":
    main()
