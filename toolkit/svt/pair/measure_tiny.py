"""Measure how the built-in pair behaves as a speculative pair (the figures in data/models/README.md).

    python -m svt.pair.measure_tiny --requests 96 --out reports/tiny_pair.md
    python -m svt.pair.measure_tiny --goals runs/hvd --hvd-report reports/hvd-h100 \\
        --demo-report reports/demo --reference-report reports/hvd-ref --reference-run runs/hvd-ref  # after make demo

For each draft and for temperature 1 and greedy: collect on the three shipped workloads (K = 5,
128 new tokens), then report acceptance (overall, and by position in both conventions), mean
acceptance length, mean q_max, and how well q_max ranks acceptance (ROC AUC, scikit-learn).
``--goals`` reads a greedy run of the five workloads instead: whether the toolcalls outputs write a
well-formed next call, the edit outputs' common prefix with the reference, and self-repetition;
``--hvd-report`` adds HVD against cache-only per workload, ``--demo-report`` AUC(q_max) at T = 1, and
``--reference-report`` the model drafter's mean yield on the real text of a reference run (and, with
``--hvd-report``, cache-only's speed-up on both runs), ``--reference-run`` the realism table of both
runs (how much of each output repeats itself). The
induction gate of the shipped target (as trained: its sharpening undone) and of ``draft-large``
and the target's held-out loss are always given.
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
from pathlib import Path

import polars as pl

from svt.collect import collect
from svt.config import load_collect_config
from svt.report.summary import acceptance_by_position, run_summary
from svt.traces import open_run


def measure(models: Path, requests: int, max_new_tokens: int, seed: int = 0) -> str:
    from sklearn.metrics import roc_auc_score

    lines = []
    drafts = [d for d in ("draft-small", "draft-large", "eagle3", "mtp") if (models / d).is_dir()]
    for draft in drafts:
        for temperature in (1.0, 0.0):
            # absolute: a relative path in a config is read from the config's folder
            base = {"target": str((models / "target").resolve()), "draft": str((models / draft).resolve()),
                    "workloads": ["code", "prose", "structured"], "requests": requests,
                    "max_new_tokens": max_new_tokens, "k": 5, "temperature": temperature,
                    "device": "cpu", "seed": seed, "max_prompt_tokens": 384}
            cfg = load_collect_config(None, base=base)
            with tempfile.TemporaryDirectory() as tmp:
                run_dir = Path(tmp) / "run"
                collect(cfg, run_dir, config_path=Path("configs/collect/demo.yaml"), progress=False)
                s = run_summary(run_dir)
                pos = acceptance_by_position(run_dir)
                d = open_run(run_dir).scan("drafts").filter(pl.col("label").is_not_null())
                d = d.select("label", "q_max", "workload").collect()
                auc = roc_auc_score(d["label"].to_numpy(), d["q_max"].to_numpy())
                by_wl = d.group_by("workload").agg(pl.col("label").mean()).sort("workload")
            name = f"{draft}, {'T=1' if temperature else 'greedy'}"
            lines.append(
                f"| {name} | {s['labelled']:,} | {s['acceptance']:.3f} | {s['mean_acceptance_length']:.2f} | "
                f"{d['q_max'].mean():.3f} | {auc:.3f} | "
                + " / ".join(f"{r:.2f}" for r in pos["conditional"]) + " | "
                + " / ".join(f"{r:.2f}" for r in pos["marginal"]) + " | "
                + ", ".join(f"{w} {a:.2f}" for w, a in by_wl.iter_rows()) + " |"
            )
    head = ("| pair, sampling | labelled drafts | acceptance | mean acceptance length | mean q_max | "
            "AUC(q_max) | conditional rate by position 0-4 | marginal rate by position 0-4 | "
            "acceptance by workload |\n|---|---|---|---|---|---|---|---|---|")
    return head + "\n" + "\n".join(lines) + "\n"


def toolcall_first_lines(run_dir: Path) -> tuple[int, int]:
    """(well-formed, requests) over a run's ``toolcalls`` requests: the output's first line must be
    the log's next call, ``calls.append(tool("read_function", module="<the prompt's module>",
    name="<identifier>", line=<int>))``, the shape every call of the log has."""
    from svt.models.loading import load_tokenizer
    from svt.traces import open_run

    run = open_run(run_dir)
    tok = load_tokenizer(run.meta["models"]["target"]["path"])
    req = run.scan("requests").filter(pl.col("workload") == "toolcalls").select("prompt_ids", "output_ids").collect()
    good = 0
    for prompt_ids, output_ids in req.iter_rows():
        prompt = tok.decode(prompt_ids, skip_special_tokens=True)
        module = re.search(r"reading `([^`]+)`", prompt)
        first = tok.decode(output_ids, skip_special_tokens=True).split("\n", 1)[0]
        good += bool(module) and re.fullmatch(
            rf'calls\.append\(tool\("read_function", module="{re.escape(module.group(1))}", '
            r'name="[A-Za-z_][A-Za-z0-9_]*", line=\d+\)\)', first) is not None
    return good, req.height


def task_goals(run_dir: Path) -> dict:
    """The pair's task figures on a greedy run of the five built-in workloads (the demo's HVD run):
    toolcalls first lines, the edit outputs' common prefix with the reference revision, and how much
    of the code and prose outputs repeats the output itself (next 8 tokens seen before)."""
    from svt.report.reference import realism_rows
    from svt.traces import open_run

    rows = realism_rows(open_run(run_dir))
    good, n = toolcall_first_lines(run_dir)
    return {
        "toolcalls_well_formed": [good, n],
        "edit_mean_common_prefix": rows.get("edit", {}).get("mean_common_prefix"),
        "output_repeats_output": {w: rows[w]["output_repeats_output"] for w in rows if w != "all"},
    }


def gate_goals(models: Path) -> dict:
    """The induction gate of the shipped target as trained (its sharpening undone: the final norm
    divided by the ``sharpen`` factor ``training.json`` records) and of ``draft-large``, with the
    held-out loss ``training.json`` recorded for the target as trained."""
    import torch

    from svt.errors import DataError
    from svt.models.induction import induction_gate, passes
    from svt.models.loading import load_tokenizer

    try:
        training = json.loads((models / "training.json").read_text())
        factor = float(training["models"]["target"]["sharpen"])
    except (OSError, json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise DataError(f"{models}/training.json: not the pair's training record ({exc}).") from None
    from transformers import AutoModelForCausalLM

    tok = load_tokenizer(str(models / "target"))
    out = {"held_out_loss_as_trained": training["models"]["target"].get("held_out_loss")}
    for name in ("target", "draft-large"):
        model = AutoModelForCausalLM.from_pretrained(models / name, dtype=torch.float32)
        if name == "target":
            with torch.no_grad():
                model.model.norm.weight.div_(factor)
        g = induction_gate(model, vocab=int(model.config.vocab_size), bos=tok.eos_token_id)
        out[f"{name}_gate"] = {"top1": round(g["top1"], 4), "cross_entropy": round(g["cross_entropy"], 3),
                               "max_induction_score": g.get("max_induction_score"), "passes": passes(g)}
    return out


def demo_auc(report_dir: Path, feature: str = "q_max") -> float:
    """AUC of ``feature`` over all labelled drafts of an ``svt evaluate`` report (the demo's)."""
    from svt.errors import DataError

    path = Path(report_dir) / "report.json"
    try:
        return float(json.loads(path.read_text())["features"][feature]["auc"])
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise DataError(f"{path}: no {feature} AUC in this report ({exc}).") from None


def reference_model_yield(report_dir: Path) -> dict[str, float]:
    """Per workload of a reference run's report: the model drafter's mean yield (tokens accepted
    per cycle of K drafts, teacher-forced on the real text)."""
    from svt.errors import DataError

    path = Path(report_dir) / "report.json"
    try:
        cache = json.loads(path.read_text())["cache"]
        return {g: round(float(v["mean_model_yield"]), 3) for g, v in cache.items()}
    except (OSError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
        raise DataError(f"{path}: no cache section with the model drafter's yields ({exc}).") from None


def hvd_against_cache_only(report_dir: Path, predictor: str = "yield-mlp") -> dict[str, dict]:
    """Per workload of an HVD report (``svt evaluate --costs``): HVD's speed-up at its best tau
    against cache-only's, and whether it is better (more than 0.5 % faster), tied or worse."""
    from svt.errors import DataError

    path = Path(report_dir) / "report.json"
    try:
        hvd = json.loads(path.read_text()).get("hvd")
    except (OSError, json.JSONDecodeError, AttributeError) as exc:
        raise DataError(f"{path}: not a readable svt report ({exc}).") from None
    if not hvd or not hvd.get("best"):
        raise DataError(f"{path}: no HVD replay in this report (evaluate a run with cache drafts and --costs).")
    cache = {r["group"]: r["speedup_vs_greedy"] for r in hvd["rows"] if r["policy"] == "cache-only"}
    out = {}
    for b in hvd["best"]:
        if b["predictor"] != predictor or b["group"] == "all":
            continue
        ratio = b["speedup_vs_greedy"] / cache[b["group"]]
        out[b["group"]] = {"hvd": round(b["speedup_vs_greedy"], 3), "cache_only": round(cache[b["group"]], 3),
                           "tau": b["tau"], "verdict": "better" if ratio > 1.005 else "worse" if ratio < 0.995 else "tie"}
    return out


def cache_only_speedups(report_dir: Path) -> dict[str, float]:
    """Per group of an HVD report (``svt evaluate --costs``): cache-only's speed-up over greedy."""
    from svt.errors import DataError

    path = Path(report_dir) / "report.json"
    try:
        rows = (json.loads(path.read_text()).get("hvd") or {}).get("rows") or []
        out = {r["group"]: round(float(r["speedup_vs_greedy"]), 3) for r in rows if r["policy"] == "cache-only"}
    except (OSError, json.JSONDecodeError, AttributeError, KeyError, TypeError, ValueError) as exc:
        raise DataError(f"{path}: not a readable svt report ({exc}).") from None
    if not out:
        raise DataError(f"{path}: no cache-only row in an HVD replay (evaluate a run with cache drafts and --costs).")
    return out


def cache_only_against_reference(target_report: Path, reference_report: Path) -> dict[str, dict]:
    """Per workload both runs share: cache-only's speed-up on the target's own run and on the real
    text of the same prompts (a reference run), and their ratio (the goal: within 1.5x)."""
    own, ref = cache_only_speedups(target_report), cache_only_speedups(reference_report)
    return {g: {"target_run": own[g], "reference_run": ref[g], "ratio": round(own[g] / ref[g], 3)}
            for g in sorted(own.keys() & ref.keys())}


def realism_against_reference(run_dir: Path, reference_run: Path) -> dict[str, dict]:
    """Per workload: how much of the outputs repeats the output itself and the prompt, on the target's
    own run and on the real text of the same prompts (a reference run; ``realism_rows``)."""
    from svt.report.reference import realism_rows
    from svt.traces import open_run

    own, ref = realism_rows(open_run(run_dir)), realism_rows(open_run(reference_run))
    keys = ("output_repeats_output", "output_repeats_prompt_or_output")
    return {g: {"target_run": {k: own[g].get(k) for k in keys}, "reference_run": {k: ref[g].get(k) for k in keys}}
            for g in sorted(own.keys() & ref.keys())}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--models", type=Path, default=Path("data/models"))
    ap.add_argument("--requests", type=int, default=96)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--goals", type=Path, default=None, metavar="RUN",
                    help="print the task figures of a greedy run of the five workloads (e.g. runs/hvd) and stop")
    ap.add_argument("--hvd-report", type=Path, default=None, metavar="REPORT",
                    help="with --goals: also HVD at its best tau against cache-only per workload (e.g. reports/hvd-h100)")
    ap.add_argument("--demo-report", type=Path, default=None, metavar="REPORT",
                    help="with --goals: also AUC(q_max) of a temperature-1 report (e.g. reports/demo)")
    ap.add_argument("--reference-report", type=Path, default=None, metavar="REPORT",
                    help="with --goals: also the model drafter's mean yield on a reference run (e.g. reports/hvd-ref), "
                         "and with --hvd-report cache-only's speed-up on both runs")
    ap.add_argument("--reference-run", type=Path, default=None, metavar="RUN",
                    help="with --goals: the realism table of the goals run against this reference run of the same "
                         "prompts (e.g. runs/hvd-ref)")
    args = ap.parse_args(argv)
    if args.goals is not None:
        from svt.errors import SvtError

        try:
            goals = task_goals(args.goals)
            goals.update(gate_goals(args.models))
            if args.hvd_report is not None:
                goals["hvd_vs_cache_only"] = hvd_against_cache_only(args.hvd_report)
            if args.demo_report is not None:
                goals["demo_auc_q_max"] = round(demo_auc(args.demo_report), 4)
            if args.reference_report is not None:
                goals["reference_model_yield"] = reference_model_yield(args.reference_report)
                if args.hvd_report is not None:
                    goals["cache_only_vs_reference"] = cache_only_against_reference(args.hvd_report,
                                                                                   args.reference_report)
            if args.reference_run is not None:
                goals["realism_vs_reference"] = realism_against_reference(args.goals, args.reference_run)
        except SvtError as exc:
            raise SystemExit(f"error: {exc}") from None
        print(json.dumps(goals, indent=2, default=str))
        return
    table = measure(args.models, args.requests, args.max_new_tokens)
    print(table)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(table)


if __name__ == "__main__":
    main()
