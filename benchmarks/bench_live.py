"""The replay held against the live engine: rounds of (a fresh cost profile, live runs of fixed K at
B = 1 and B = 8 with continuous batching, the replay of the same policies), and per point the
replay's predicted decode tokens/s over the engine's measured ones, median [range] over rounds.

    python benchmarks/bench_live.py [--rounds 3] [--ks 0,1,3] [--batches 1,8] [--requests 32] [--tokens 96] [--av]

Each round profiles the pair at the collection's context (`svt collect --profile-costs`), collects
each (K, B) live on the demo config (the EAGLE-3 head, T = 1; hidden states and distributions not
logged), and evaluates the largest K's run at the largest B as the trace with every live run passed
by `--live` (so the replay and the engine see the same prompts). With `--av`, each round also fits
the online estimator (irls-online) on that trace and collects live AV and AV+length with it at each
B (the policies `AV q_max`-style rows of the replay, named after the fit). Results go to
reports/bench/live.json and live.md. Run it on a quiet machine: it measures wall-clock.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SVT = [sys.executable, "-m", "svt.cli"]


def _run(args: list[str], pythonpath: str | None = None) -> None:
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    r = subprocess.run([*SVT, *args], capture_output=True, text=True, cwd=ROOT, env=env)
    if r.returncode:
        raise SystemExit(f"svt {' '.join(args)} failed:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")


def one_round(i: int, ks: list[int], batches: list[int], requests: int, tokens: int, work: Path,
              av: bool = False, sets: tuple[str, ...] = (), variants=(("", None),)) -> list[dict]:
    cfg = str(ROOT / "configs" / "collect" / "demo.yaml")
    common = ["--set", f"requests={requests}", "--set", f"max_new_tokens={tokens}", "--set", "log.hidden=false",
              "--set", "log.dists_fraction=0", "--set", "schedule=continuous", "--quiet", "--overwrite",
              *[a for kv in sets for a in ("--set", kv)]]
    # one profile per variant (another checkout's profiler: PYTHONPATH), back to back, in an order
    # that alternates round by round; the live runs and the replays are this checkout's
    tables = {}
    for name, path in (variants if i % 2 == 0 else variants[::-1]):
        tables[name] = work / f"costs-{i}{'-' + name if name else ''}.yaml"
        _run(["collect", cfg, "--profile-costs", "--out", str(tables[name]), "--profile-batches",
              ",".join(str(b) for b in sorted({1, 2, 4, *batches})), "--set", f"k={max(ks)}", *common], path)
    costs = tables[variants[0][0]]
    lives = []
    for b in batches:
        for k in ks:
            out = work / f"r{i}-k{k}-b{b}"
            _run(["collect", cfg, "--out", str(out), "--set", f"k={k}", "--set", f"batch_size={b}", *common])
            lives.append(out)
    trace = work / f"r{i}-k{max(ks)}-b{max(batches)}"
    fits = []
    if av:
        fit = work / f"fit-{i}.json"
        _run(["fit", str(trace), "--model", "irls-online", "--out", str(fit), "--overwrite"])
        fits = ["--fit", str(fit)]
        for b in batches:
            for name, extra in (("av", []), ("avlen", ["--set", "av.length=true"])):
                out = work / f"r{i}-{name}-b{b}"
                _run(["collect", cfg, "--out", str(out), "--set", f"k={max(ks)}", "--set", f"batch_size={b}",
                      "--set", f"av.fit={fit}", "--set", f"av.costs={costs}", "--set", "av.explore=0", *extra, *common])
                lives.append(out)
    rows = []
    for name, table in tables.items():
        rep = work / f"report-{i}{'-' + name if name else ''}"
        _run(["evaluate", str(trace), "--out", str(rep), "--overwrite", "--feature", "q_max", "--costs", str(table),
              *fits, *[a for p in lives for a in ("--live", str(p))]])
        rows += [{**r, "round": i, "variant": name}
                 for r in json.loads((rep / "report.json").read_text())["simulation"]["live"]["runs"]]
    return rows


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ks", default="0,1,3")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--av", action="store_true", help="also live AV and AV+length with an online fit")
    ap.add_argument("--set", action="append", default=[], help="KEY=VALUE for every collection (e.g. device=cuda)")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=PYTHONPATH",
                    help="profile also with another checkout's toolkit (empty PYTHONPATH: this one), each round, "
                         "against the same live runs")
    ap.add_argument("--work", type=Path, default=ROOT / "runs" / "bench-live")
    ap.add_argument("--out", type=Path, default=ROOT / "reports" / "bench" / "live.json")
    args = ap.parse_args(argv)
    ks = [int(x) for x in args.ks.split(",")]
    batches = [int(x) for x in args.batches.split(",")]
    bad = [v for v in args.variant if "=" not in v or not v.split("=", 1)[0].isidentifier()]
    names = [v.split("=", 1)[0] for v in args.variant]
    if bad or len(set(names)) != len(names):
        ap.error(f"--variant takes NAME=PYTHONPATH with distinct names (PYTHONPATH may be empty: this checkout); "
                 f"got {', '.join(bad) or ', '.join(args.variant)}")
    missing = [v for v in args.variant if v.split("=", 1)[1] and not Path(v.split("=", 1)[1]).is_dir()]
    if missing:
        ap.error(f"--variant: no such directory: {', '.join(missing)}")
    variants = tuple((v.split("=", 1)[0], v.split("=", 1)[1] or None) for v in args.variant) or (("", None),)
    args.work.mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(args.rounds):
        rows += one_round(i, ks, batches, args.requests, args.tokens, args.work, args.av, tuple(args.set), variants)
        print(f"round {i + 1}/{args.rounds} done", flush=True)
    points = []
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    for b in batches:
        for policy in policies:
            for name, _ in variants:
                rs = [r for r in rows if r["batch_size"] == b and r["policy"] == policy and r["variant"] == name]
                if not rs:
                    continue

                def st(key, rs=rs):
                    v = np.array([r[key] for r in rs], dtype=np.float64)
                    return {"median": float(np.median(v)), "min": float(v.min()), "max": float(v.max())}

                points.append({"policy": policy, "batch": b, "variant": name, "rounds": len(rs), **{key: st(key) for key in (
                    "ratio", "ratio_at_run_speed", "replay_tokens_per_s", "live_tokens_per_s", "table_vs_steps", "table_vs_forwards", "step_vs_forwards",
                    "mean_batch", "waiting_mean_batch", "replay_mean_batch", "live_tokens_per_step", "replay_tokens_per_step")
                    if all(r.get(key) is not None for r in rs)}})
    result = {"config": {"rounds": args.rounds, "ks": ks, "batches": batches, "requests": args.requests,
                         "max_new_tokens": args.tokens}, "points": points, "runs": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))

    def f(s, d=2):
        return f"{s['median']:,.{d}f} [{s['min']:,.{d}f}-{s['max']:,.{d}f}]"

    lines = ["| policy, B | replay / live | at the run's speed | replay tok/s | live tok/s | table / steps | table / forwards | step / forwards | "
             "mean batch | while requests wait | replay mean batch | tok/step live | tok/step replay |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for p in points:
        tag = f" [{p['variant']}]" if p["variant"] else ""
        lines.append(f"| {p['policy']}, B = {p['batch']}{tag} | {f(p['ratio'])} | "
                     f"{f(p['ratio_at_run_speed']) if 'ratio_at_run_speed' in p else '—'} | {f(p['replay_tokens_per_s'], 0)} | "
                     f"{f(p['live_tokens_per_s'], 0)} | {f(p['table_vs_steps'])} | {f(p['table_vs_forwards'])} | "
                     f"{f(p['step_vs_forwards'])} | "
                     f"{f(p['mean_batch'])} | {f(p['waiting_mean_batch']) if 'waiting_mean_batch' in p else '—'} | "
                     f"{f(p['replay_mean_batch']) if 'replay_mean_batch' in p else '—'} | "
                     f"{f(p['live_tokens_per_step'], 3)} | {f(p['replay_tokens_per_step'], 3)} |")
    md = "\n".join(lines)
    args.out.with_suffix(".md").write_text(md + "\n")
    print(md)
    return result


if __name__ == "__main__":
    main()
