"""Does `make regression` catch a changed predictor on another machine? runs/ci (collected by `make
regression` first) as another machine would collect it: the same tokens and labels, probabilities
off in the 7th digit. Evaluated against ci/baseline with irls-online's damping at 500 (unchanged:
exit 0 expected) and 2500 (a changed predictor: exit 1 expected).

    .venv/bin/python scripts/pairing_check.py
"""
import shutil
import subprocess
from pathlib import Path

import numpy as np
import polars as pl

from svt.traces.io import open_run, record_shards, write_meta

src, out = Path("runs/ci"), Path("runs/ci-other-machine")
shutil.rmtree(out, ignore_errors=True)
shutil.copytree(src, out)
rng = np.random.default_rng(0)
parts = sorted((out / "drafts").glob("part-*.parquet"))
for p in parts:
    df = pl.read_parquet(p)
    df = df.with_columns(*((pl.col(c) * pl.Series(1.0 - 1e-7 * rng.random(df.height))).cast(df.schema[c]).alias(c)
                           for c in ("q_max", "q_sampled", "q_entropy")))
    df.write_parquet(p)
meta = open_run(out, deep=False).meta
record_shards(meta, "drafts", parts)
write_meta(out, meta)
svt = ".venv/bin/svt"
for damping in ("500", "2500"):
    f = f"runs/ci-other-fits-{damping}"
    for model in ("irls-online", "logistic"):
        extra = ["--damping", damping] if model == "irls-online" else []
        subprocess.run([svt, "fit", str(out), "--model", model, *extra, "--out", f"{f}/{model}.json", "--overwrite"],
                       check=True, capture_output=True)
    r = subprocess.run([svt, "evaluate", str(out), "--out", f"reports/ci-other-{damping}", "--overwrite", "--by", "workload",
                        "--bootstrap", "100", "--fit", f"{f}/irls-online.json", "--fit", f"{f}/logistic.json",
                        "--costs", "configs/costs/h100-llama8b-eagle.yaml", "--baseline", "ci/baseline/report.json"],
                       capture_output=True, text=True)
    said = [line for line in r.stdout.splitlines() + r.stderr.splitlines() if "paired" in line or "regressed" in line]
    print(f"damping {damping}: exit {r.returncode}", *said[-3:], sep="\n  ")
