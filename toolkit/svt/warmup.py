"""Compile svt's numba kernels ahead of their first use: ``python -m svt.warmup`` (``make setup`` runs it).

svt's compiled loops (the metrics engine, the online IRLS replay, the AV replay, the data identity)
are numba functions cached on disk beside their source (``__pycache__/*.nbi``, ``*.nbc``). A fresh
checkout has no cache, so the first ``svt fit`` / ``svt evaluate`` compiles them (about 30 s on two CPU
cores) and every later call loads them. This runs the real paths once, on a small collection of the
built-in pair in a temporary folder (collect, the online and offline fits, an evaluation with
bootstrap, groups, the fits and the AV replay), so the compilation happens at set-up. The cache is
keyed by each kernel's source file: when a kernel changes, its first use compiles it again.
"""

from __future__ import annotations

import contextlib
import io
import sys
import tempfile
import time
from pathlib import Path

from svt.config import ROOT


def warm(quiet: bool = True) -> list[str]:
    """Run the paths that compile the kernels; returns the svt commands it ran."""
    from svt.cli import app

    costs = ROOT / "configs" / "costs" / "h100-llama8b-eagle.yaml"
    with tempfile.TemporaryDirectory(prefix="svt-warmup-") as tmp:
        run, fits, report = Path(tmp) / "run", Path(tmp) / "fits", Path(tmp) / "report"
        commands = [
            ["collect", str(ROOT / "configs" / "collect" / "demo.yaml"), "--out", str(run), "--quiet",
             "--set", "requests=12", "--set", "max_new_tokens=24", "--set", "batch_size=6",
             "--set", "workloads=[code, prose]", "--set", "device=cpu"],
            ["fit", str(run), "--model", "irls-online,logistic", "--out", str(fits)],
            ["evaluate", str(run), "--out", str(report), "--by", "workload", "--bootstrap", "2",
             "--replay-bootstrap", "2", "--fit", str(fits / "irls-online.json"), "--fit", str(fits / "logistic.json"),
             "--costs", str(costs)],
        ]
        for argv in commands:
            out = io.StringIO()
            try:
                with contextlib.redirect_stdout(out) if quiet else contextlib.nullcontext():
                    code = app(argv, standalone_mode=False)  # svt's errors return their exit code
            except SystemExit as exc:
                code = exc.code
            if code not in (0, None):
                raise RuntimeError(f"svt {argv[0]} exited with {code}:\n{out.getvalue()[-2000:]}")
    _large_run_kernels()
    return [a[0] for a in commands]


def _large_run_kernels() -> None:
    """The kernels only a run beyond `svt.metrics.ordered.LARGE` labelled drafts reaches: the in-place
    sort, and scores read part by part as float32 when exact, and their keys."""
    import numpy as np

    from svt.metrics.ordered_kernel import group_start
    from svt.metrics.radix_kernel import sort_in_place
    from svt.metrics.ranks_kernel import fill_float32, float32_keys, segment_start

    key = np.empty(1 << 17, dtype=np.uint64)
    scores = np.empty(key.size, dtype=np.float32)
    fill_float32(np.random.default_rng(0).random(key.size), scores)
    float32_keys(scores, key, 0)
    sort_in_place(key)
    for s in (scores, scores.astype(np.float64)):  # where a half's walk may start, float32 or float64 scores
        segment_start(key, s, True, key.size // 2)
    group_start(key.view(np.uint32)[1::2], key.size // 2)  # where the ordered pass's walk down starts


def main() -> int:
    t0 = time.perf_counter()
    try:
        ran = warm()
    except Exception as exc:  # noqa: BLE001 - a warm-up only saves time: say why, let set-up go on
        print(f"warning: svt's kernels were not compiled ahead ({type(exc).__name__}: {exc}); "
              "the first svt fit / evaluate will compile them", file=sys.stderr)
        return 1
    print(f"svt kernels compiled ({', '.join(ran)} on a small run of the built-in pair): "
          f"{time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
