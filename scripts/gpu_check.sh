#!/usr/bin/env bash
# One prepared GPU check of svt's CUDA paths (make gpu-check). Under 12 minutes on one GPU; results in
# $OUT (set by the device tool) or reports/gpu/: env.json, tests.log + tests.xml, costs-*.yaml,
# bench-collect.json, summary.json and summary.md (one screen: what passed, the measured figures).
#
#   bash scripts/gpu_check.sh                      # on a machine with a CUDA GPU
#   GPU_CHECK_DEVICE=cpu bash scripts/gpu_check.sh # dry run of every step on the CPU, tiny sizes
#
# On a machine without a GPU (and without GPU_CHECK_DEVICE=cpu) it says so in one line and exits 0.
# Dependencies: torch and transformers are expected on the GPU machine; svt's others (polars, numpy,
# scipy, scikit-learn, arctic-inference, typer, rich, pyyaml, numba, matplotlib, safetensors, pytest,
# hypothesis) are installed first, offline, from a folder of wheels when one is present:
# GPU_CHECK_WHEELS (default: wheels/), made here with
#   pip download -d wheels polars scipy scikit-learn arctic-inference typer rich pyyaml numba \
#     matplotlib pytest hypothesis nbclient duckdb --python-version 3.11 --only-binary=:all:
# (arctic-inference builds from source where no wheel fits: build it here with `pip wheel`).
set -uo pipefail
cd "$(dirname "$0")/.."
DEVICE="${GPU_CHECK_DEVICE:-cuda}"
OUT="${OUT:-reports/gpu}"
PY="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}"
WHEELS="${GPU_CHECK_WHEELS:-wheels}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 SVT_TEST_DEVICE="$DEVICE"

if [ "$DEVICE" != "cpu" ] && ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  echo "gpu-check: no CUDA GPU on this machine (torch sees none); nothing run. GPU_CHECK_DEVICE=cpu runs a dry run."
  exit 0
fi
mkdir -p "$OUT"
: > "$OUT/steps.tsv"
if [ -d "$WHEELS" ]; then  # offline, before anything else imports svt
  "$PY" -m pip install -q --no-index --find-links "$WHEELS" -r <(ls "$WHEELS" | sed -E 's/-[0-9].*//' | sort -u) \
    > "$OUT/install.log" 2>&1 || echo "gpu-check: installing from $WHEELS failed (see install.log)"
  "$PY" -m pip install -q --no-index --no-deps --no-build-isolation -e . >> "$OUT/install.log" 2>&1
fi
export PYTHONPATH="$PWD/toolkit${PYTHONPATH:+:$PYTHONPATH}"

step() {  # step NAME SECONDS CMD...: run it with a time limit, record rc and seconds
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  printf '%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - t0))" >> "$OUT/steps.tsv"
  echo "gpu-check: $name rc=$rc ($((SECONDS - t0)) s)"
}

if [ "$DEVICE" = "cpu" ]; then SIZE=tiny; DTYPE=float32; PROMPTS=2; NEW=16; REPEATS=1; BATCHES=1,2
  LIVE="--rounds 1 --ks 0,1 --batches 1,2 --requests 4 --tokens 8"; REF_REQUESTS=5
else SIZE=1b; DTYPE=bfloat16; PROMPTS=16; NEW=64; REPEATS=3; BATCHES=1,2,4,8,16,32,64
  LIVE="--rounds 2 --ks 0,3 --batches 1,8,32 --requests 64 --tokens 96 --av"; REF_REQUESTS=120; fi
WORK="$OUT/work"

# 1. environment
step env 60 "$PY" - "$OUT/env.json" "$DEVICE" <<'PYEOF'
import json, sys, platform
import torch, transformers
dev = sys.argv[2]
info = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
        "cuda": torch.version.cuda, "device": dev}
if dev != "cpu":
    free, total = torch.cuda.mem_get_info()
    info.update(name=torch.cuda.get_device_name(0), capability=list(torch.cuda.get_device_capability(0)),
                free_gib=round(free / 2**30, 1), total_gib=round(total / 2**30, 1))
json.dump(info, open(sys.argv[1], "w"), indent=2)
print(info)
PYEOF
# 2. the CUDA-marked tests (on the CPU in a dry run)
# shellcheck disable=SC2086  # GPU_CHECK_PYTEST_ARGS: extra pytest arguments (the suite's dry run selects one test)
step tests 240 "$PY" -m pytest -p no:cacheprovider -m cuda tests/gpu --junitxml="$OUT/tests.xml" ${GPU_CHECK_PYTEST_ARGS:-}
# 3. cost profiles: the built-in pair, and a pair of a realistic shape made from random weights
step random-pair 180 "$PY" -m svt.models.random_pair --out "$WORK/random-$SIZE" --size "$SIZE" --device "$DEVICE"
step costs-tiny 120 "$PY" -m svt.cli collect configs/collect/demo.yaml --profile-costs --quiet --overwrite \
  --out "$OUT/costs-builtin.yaml" --set device="$DEVICE" --set dtype="$DTYPE" --profile-batches "$BATCHES"
step costs-random 240 "$PY" -m svt.cli collect configs/collect/demo.yaml --profile-costs --quiet --overwrite \
  --out "$OUT/costs-random-$SIZE.yaml" --set device="$DEVICE" --set dtype="$DTYPE" --profile-batches "$BATCHES" \
  --set target="$WORK/random-$SIZE/target" --set draft="$WORK/random-$SIZE/draft"
# 4. the collector against transformers' assisted generation (bench_collect's method)
step bench-collect 240 "$PY" benchmarks/bench_collect.py --device "$DEVICE" --dtype "$DTYPE" \
  --prompts "$PROMPTS" --max-new-tokens "$NEW" --repeats "$REPEATS" --out "$OUT/bench-collect.json"
# 5. the replay against the live engine: fixed K (and AV, AV+length on the GPU) at each batch size
# shellcheck disable=SC2086  # LIVE: the benchmark's options
step live-replay 300 "$PY" benchmarks/bench_live.py $LIVE --set device="$DEVICE" --set dtype="$DTYPE" \
  --work "$WORK/live" --out "$OUT/live.json"
# 6. reference runs with a hidden-state head (the target teacher-forced over real text, its EAGLE-3 head
# drafting from its hidden states): the built-in pair on the shipped workloads' references, then a
# served model and its published head where GPU_CHECK_REF_TARGET and GPU_CHECK_REF_HEAD name local
# folders (GPU_CHECK_REF_WORKLOADS: a JSONL log with references; default the shipped ones)
step reference-head 240 "$PY" -m svt.cli collect configs/collect/hvd-reference.yaml --set draft=builtin:eagle3 \
  --set device="$DEVICE" --set requests="$REF_REQUESTS" --quiet --overwrite --out "$WORK/ref-eagle3"
step reference-head-report 120 "$PY" -m svt.cli evaluate "$WORK/ref-eagle3" --out "$OUT/reference-head" --overwrite \
  --costs configs/costs/h100-llama8b-eagle.yaml
if [ -d "${GPU_CHECK_REF_TARGET:-/nonexistent}" ] && [ -d "${GPU_CHECK_REF_HEAD:-/nonexistent}" ]; then
  step reference-real-head 300 "$PY" -m svt.cli collect configs/collect/hvd-reference.yaml \
    --set target="$GPU_CHECK_REF_TARGET" --set draft="$GPU_CHECK_REF_HEAD" --set device="$DEVICE" \
    --set dtype="$DTYPE" ${GPU_CHECK_REF_WORKLOADS:+--set workloads="[$GPU_CHECK_REF_WORKLOADS]"} \
    --set requests="$REF_REQUESTS" --quiet --overwrite --out "$WORK/ref-real"
  step reference-real-head-report 120 "$PY" -m svt.cli evaluate "$WORK/ref-real" --out "$OUT/reference-real-head" \
    --overwrite --costs configs/costs/h100-llama8b-eagle.yaml
else
  echo "gpu-check: no served model and head to run a reference run on (set GPU_CHECK_REF_TARGET and GPU_CHECK_REF_HEAD to local folders); skipped"
fi
rm -rf "$WORK"
# 7. the summary
"$PY" - "$OUT" <<'PYEOF'
import json, sys, datetime as dt
from pathlib import Path
out = Path(sys.argv[1])
steps = [dict(zip(("step", "rc", "seconds"), line.split("\t"))) for line in (out / "steps.tsv").read_text().splitlines()]
for s in steps:
    s["rc"], s["seconds"] = int(s["rc"]), int(s["seconds"])
    s["passed"] = s["rc"] == 0
def load(name):
    p = out / name
    return json.loads(p.read_text()) if p.is_file() else None
summary = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "env": load("env.json"),
           "steps": steps, "all_passed": all(s["passed"] for s in steps), "bench_collect": load("bench-collect.json")}
tests_log = (out / "tests.log").read_text() if (out / "tests.log").is_file() else ""
summary["tests_tail"] = tests_log.strip().splitlines()[-3:] if tests_log.strip() else []
import yaml
costs = {}
for f in sorted(out.glob("costs-*.yaml")):
    t = yaml.safe_load(f.read_text())
    v = t.get("verify_ms", {})
    costs[f.stem] = {"draft_ms_b1_k1": (t.get("draft_ms", {}).get(1) or {}).get(1),
                     "verify_ms_1": v.get(1), "verify_ms_max_tokens": max(v) if v else None,
                     "verify_ms_at_max": v[max(v)] if v else None}
summary["costs"] = costs
(out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
env = summary["env"] or {}
lines = [f"# svt GPU check, {summary['date']}", "",
         f"Device: {env.get('name', env.get('device'))}; torch {env.get('torch')} (CUDA {env.get('cuda')}), "
         f"transformers {env.get('transformers')}, Python {env.get('python')}.", "",
         "| step | result | seconds |", "|---|---|---|",
         *(f"| {s['step']} | {'passed' if s['passed'] else 'FAILED (rc ' + str(s['rc']) + ')'} | {s['seconds']} |" for s in steps),
         "", "Tests: " + " / ".join(summary["tests_tail"]), "", "| cost table | draft ms (B=1, k=1) | verify ms (1 token) | verify ms (most tokens) |",
         "|---|---|---|---|",
         *(f"| {k} | {c['draft_ms_b1_k1']} | {c['verify_ms_1']} | {c['verify_ms_at_max']} ({c['verify_ms_max_tokens']} tokens) |" for k, c in costs.items())]
b = summary["bench_collect"]
if b:
    lines += ["", "| path (built-in pair) | tokens/s | vs hf assisted |", "|---|---|---|",
              *(f"| {k} | {v['median']:.0f} | {b['ratio_vs_assisted'][k]['median']:.2f}x |" for k, v in b["tokens_per_s"].items())]
for name in ("reference-head", "reference-real-head"):  # cycles per 1000 tokens of each reference run's HVD replay
    rep = load(f"{name}/report.json")
    rows = {r["policy"]: r for r in ((rep or {}).get("hvd") or {}).get("rows", []) if r["group"] == "all"}
    if rows:
        best = min((r for p, r in rows.items() if p.startswith("hvd ")), key=lambda r: r["ms"], default=None)
        cells = [f"{p} {rows[p]['cycles_per_1000']:.0f}" for p in ("model-only", "cache-only", "oracle-switch") if p in rows]
        lines += ["", f"{name} (cycles per 1000 tokens, H100 roofline): " + ", ".join(cells)
                  + (f", best HVD {best['cycles_per_1000']:.0f} ({best['policy']})" if best else "")]
live = out / "live.md"
if live.is_file():
    summary["live"] = load("live.json")["points"]
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    lines += ["", "Replay against the live engine (median [range] over rounds):", "", live.read_text().strip()]
(out / "summary.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
PYEOF
# exit 1 when any step failed (its rc, the second column, is not 0)
awk -F'\t' '$2 != 0 { bad = 1 } END { exit bad }' "$OUT/steps.tsv"
