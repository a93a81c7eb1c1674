"""Reports of reference runs (no model drafts) and the realism table: how far a pair's outputs are
from the reference text of the same prompts (task following, copying vs looping, cache statistics
next to the reference run's)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import numpy as np
import polars as pl

from svt import __version__
from svt.errors import DataError
from svt.metrics.repetition import common_prefix, repeated_share

NGRAM = 8

NO_PROBABILITIES = ("A reference run has no target probabilities (its output is the reference text, with no "
                    "target forward): no acceptance features, Adaptive Verification replay or losslessness "
                    "audit. What it has: the cache drafts' oracle yields against the text, the model drafter's "
                    "yields ({drafter}), yield predictors and the HVD replay.")


def cache_only_report(runs: list, opts, infos: list[dict], metas: list[dict]) -> dict:
    """`svt evaluate` on runs without model drafts (reference runs, vLLM suffix runs): the cache,
    yield and HVD sections, and the realism table."""
    from svt.fit import split_fits
    from svt.report.hvd import hvd_report
    from svt.report.schema import REPORT_SCHEMA

    check_reference_run(opts.reference_run)
    acc_fits, yield_fits = split_fits(opts.fits)
    if acc_fits:
        raise DataError(f"{acc_fits[0]}: an acceptance fit needs model drafts with target probabilities; these runs "
                        "have none (only cache drafts). Pass yield fits only.")
    drafters = [m.get("drafter") or {} for m in metas]
    kinds = sorted({d.get("kind", "model") for d in drafters})
    desc = {"stand-in": "a stand-in drafter drawn from given acceptance rates", "model": "a real drafter",
            "head": "a real hidden-state drafter over the target"}
    note = NO_PROBABILITIES.format(drafter=", ".join(desc.get(k, k) for k in kinds))
    if not all(m.get("engine") == "reference" for m in metas):
        note = ("No model-drafter drafts in these runs (cache-only, e.g. vLLM's `suffix` method): only the cache, "
                "yield and HVD sections apply.")
    report = {
        "report_schema": REPORT_SCHEMA, "svt_version": __version__,
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "runs": infos, "kind": "cache-only", "note": note,
        "drafters": drafters,
        "settings": {"features": [], "n_bins": opts.n_bins, "bootstrap": opts.bootstrap, "seed": opts.seed,
                     "by": opts.by, "high_yield": opts.high_yield},
        "features": {}, "acceptance": None, "length_calibration": None, "lossless_bias": None,
        "simulation": None, "groups": {},
    }
    report.update(hvd_report([Path(r) for r in runs], yield_fits, [i["run_id"] for i in infos],
                             costs_path=opts.costs, high_yield=opts.high_yield, seed=opts.seed))
    report["document_checks"] = document_checks(report)
    report["realism"] = realism_section(runs, opts.reference_run)
    return report


def document_checks(report: dict) -> dict | None:
    """The Hybrid Verified Decoding paper's headline checks beside this report's figures."""
    hmap = report.get("hvd_map") or {}
    rows = [r for r in hmap.get("rows") or [] if r["group"] != "all"]
    yl = report.get("yield") or {}
    cache = report.get("cache") or {}
    if not rows and not yl:
        return None
    out: dict = {}
    if rows:
        out["hvd_vs_greedy"] = {"better": sum(r["hvd"]["ms"] < r["greedy"]["ms"] for r in rows), "pairs": len(rows),
                                "document": "better in 47 of 48 (workload, drafter) pairs"}
        out["hvd_vs_cache_only"] = {"better": sum(r["hvd"]["ms"] < r["cache-only"]["ms"] for r in rows),
                                    "ties": sum(r["hvd"]["ms"] == r["cache-only"]["ms"] for r in rows),
                                    "pairs": len(rows), "document": "better in 46 of 48 pairs"}
    name = hmap.get("predictor")
    block = (yl.get("predictors") or {}).get(name) if name else None
    if block:
        out["high_yield"] = {"predictor": name, "threshold": yl.get("high_yield"),
                             "precision": block.get("precision"), "recall": block.get("recall"),
                             "document": "precision 78-88 %, recall 61-80 % at yield >= 6"}
    two = report.get("two_sided") or {}
    held = (two.get("groups") or {}).get("all")
    if held:  # τ chosen on other requests than those counted, with the run's own model drafter
        out["cycles_per_1000"] = {"model_only": held["model_only"]["cycles_per_1000"],
                                  "hvd": held["one_sided"]["cycles_per_1000"], "requests": held.get("requests"),
                                  "split": two.get("split"), "document": "571 for EAGLE3 against 200 for HVD"}
    if rows:
        out["hvd_vs_greedy"]["split"] = out["hvd_vs_cache_only"]["split"] = hmap.get("split")
    if cache:
        out["top10_token_share"] = {g: c.get("top10_token_share") for g, c in cache.items()}
        out["top10_document"] = "the top 10 % of drafts carry most accepted tokens where the cache rarely matches"
    return out


def _references(run) -> dict[int, list[int]]:
    if run.meta.get("engine") == "reference":
        req = run.scan("requests").select("request", "output_ids").collect()
        return dict(zip(req["request"].to_list(), req["output_ids"].to_list(), strict=True))
    if not run.has("references"):
        return {}
    ref = run.scan("references").collect()
    return dict(zip(ref["request"].to_list(), ref["reference_ids"].to_list(), strict=True))


def realism_rows(run) -> dict[str, dict]:
    """Per workload (and ``all``): repetition statistics of the outputs and, where the prompts carry
    references, of the references and the outputs' common prefix with them."""
    req = run.scan("requests").select("request", "workload", "prompt_ids", "output_ids").sort("request").collect()
    refs = _references(run)
    is_reference = run.meta.get("engine") == "reference"
    acc: dict[str, dict] = {}
    for r in req.iter_rows(named=True):
        prompt, output = np.asarray(r["prompt_ids"]), np.asarray(r["output_ids"])
        for g in ("all", r["workload"]):
            a = acc.setdefault(g, {"requests": 0, "out": [0, 0, 0], "ref": [0, 0, 0], "prefix": [], "with_ref": 0})
            a["requests"] += 1
            pos, hit_all, hit_out = repeated_share(prompt, output, NGRAM)
            a["out"] = [a["out"][0] + pos, a["out"][1] + hit_all, a["out"][2] + hit_out]
            if r["request"] in refs and not is_reference:
                ref = np.asarray(refs[r["request"]])
                a["with_ref"] += 1
                a["prefix"].append(common_prefix(output, ref))
                pos, hit_all, hit_out = repeated_share(prompt, ref, NGRAM)
                a["ref"] = [a["ref"][0] + pos, a["ref"][1] + hit_all, a["ref"][2] + hit_out]
    out = {}
    for g, a in acc.items():
        o, f = a["out"], a["ref"]
        out[g] = {"requests": a["requests"], "with_reference": a["with_ref"],
                  "output_repeats_prompt_or_output": o[1] / o[0] if o[0] else None,
                  "output_repeats_output": o[2] / o[0] if o[0] else None,
                  "reference_repeats_prompt_or_output": f[1] / f[0] if f[0] else None,
                  "reference_repeats_output": f[2] / f[0] if f[0] else None,
                  "mean_common_prefix": float(np.mean(a["prefix"])) if a["prefix"] else None}
    return out


def _cache_stats(path, requests: set[int] | None = None) -> dict:
    from svt.fit.yield_data import load_cache_drafts_for_fit
    from svt.report.hvd import cache_opportunity

    rows, _ = load_cache_drafts_for_fit([path], with_empty=True)
    if requests is not None:
        rows = rows.filter(pl.col("request").is_in(sorted(requests)))
    return cache_opportunity(rows, 6)


def _prompts(run) -> dict[tuple, int]:
    req = run.scan("requests").select("request", "workload", "prompt_ids").sort("request").collect()
    out: dict[tuple, int] = {}
    for r, w, p in req.iter_rows():
        out.setdefault((w, tuple(p)), r)
    return out


def matched_requests(run, ref, path, reference_run) -> tuple[set[int], dict]:
    """The reference run's requests that are this run's (the same workload and prompt tokens), and
    what the report says about the match."""
    mine, theirs = _prompts(run), _prompts(ref)
    shared = set(mine) & set(theirs)
    if not shared:
        raise DataError(f"--reference-run {reference_run} shares no request with {path} (none has the same workload "
                        "and prompt tokens): another tokenizer, chat template, max_prompt_tokens or turns setting?")
    only_run = sorted(mine[k] for k in set(mine) - shared)
    only_ref = sorted(theirs[k] for k in set(theirs) - shared)
    if not only_run and not only_ref:
        note = f"the same {len(shared)} requests (matched by workload and prompt tokens)."
    else:
        note = (f"{len(shared)} requests in common (matched by workload and prompt tokens); its cache columns are "
                f"computed on those. Only in this run: {len(only_run)}"
                + (f" (requests {', '.join(map(str, only_run[:5]))}{' ...' if len(only_run) > 5 else ''})"
                   if only_run else "")
                + f"; only in the reference run: {len(only_ref)}"
                + (f" (requests {', '.join(map(str, only_ref[:5]))}{' ...' if len(only_ref) > 5 else ''})"
                   if only_ref else "") + ".")
    return {theirs[k] for k in shared}, {"shared": len(shared), "only_in_run": only_run,
                                         "only_in_reference": only_ref, "note": note}


def check_reference_run(reference_run: str | None):
    """Open ``--reference-run`` (before any work): it must be a reference run."""
    from svt.traces.io import open_run

    if reference_run is None:
        return None
    ref = open_run(reference_run, deep=False, tables=["requests", "cache_drafts"])
    if ref.meta.get("engine") != "reference":
        raise DataError(f"--reference-run {reference_run}: not a reference run (collect it with "
                        "`svt collect CONFIG --engine reference`).")
    return ref


def realism_section(runs: list, reference_run: str | None = None) -> dict | None:
    """The realism table of each run that has references or is a reference run (None if none has),
    with the cache statistics of ``reference_run`` (a reference run of the same prompts) beside the
    run's own."""
    from svt.traces.io import open_run

    out = {}
    ref = check_reference_run(reference_run)
    names = [Path(r).name for r in runs]
    if len(set(names)) != len(names):
        names = [str(r) for r in runs]
    for path, name in zip(runs, names, strict=True):
        run = open_run(path, deep=False, tables=["requests", "references", "cache_drafts"])
        if reference_run is not None and Path(path).resolve() != Path(reference_run).resolve():
            theirs = (ref.meta.get("workload_sha256") or {})
            mine = run.meta.get("workload_sha256") or {}
            if theirs != mine:
                raise DataError(f"--reference-run {reference_run} was collected on other prompt files than {path} "
                                "(workload hashes differ): its text is not the reference of these prompts.")
        if not (run.has("references") or run.meta.get("engine") == "reference"):
            continue
        block = {"ngram": NGRAM, "kind": "reference" if run.meta.get("engine") == "reference" else "target",
                 "workloads": realism_rows(run)}
        if run.has("cache_drafts"):
            block["cache"] = _cache_stats(path)
        if ref is not None and Path(path).resolve() != Path(reference_run).resolve():
            shared, block["reference_requests"] = matched_requests(run, ref, path, reference_run)
            block["reference_cache"] = _cache_stats(reference_run, shared)
            block["reference_run"] = str(reference_run)
        out[name] = block
    return out or None
