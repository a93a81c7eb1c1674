"""Writing a report: report.json (machine-readable) and report.md (tables readable on GitHub)."""

from __future__ import annotations

import math
import os
from pathlib import Path

from svt.errors import ConfigError, DataError
from svt.fileio import json_text, read_json, write_text_atomic

HEAD = ("auc", "log_loss", "ece", "brier", "mean_pred", "accept_rate", "n")


def fmt(v, digits: int = 4) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def _ci(block: dict, key: str) -> str:
    ci = block.get("ci95", {}).get(key)
    return f" [{ci[0]:.4f}, {ci[1]:.4f}]" if ci else ""


def feature_rows(features: dict, scope: str | None = None, ci: bool = True) -> list[list[str]]:
    """One row per feature: name, lossless, then the HEAD metrics of ``scope`` (None = overall)."""
    rows = []
    for name, f in features.items():
        block = f if scope is None else f[scope]
        rows.append([shown(name, f), fmt(f["lossless"]), *(fmt(block.get(k)) + (_ci(block, k) if ci and k in ("auc", "log_loss", "ece", "brier") else "") for k in HEAD)])
    return rows


def shown(name: str, block: dict) -> str:
    """How a feature is named in tables and figures: ``−entropy`` for a feature scored negated."""
    return block.get("shown_as") or name


DIRECTION_NOTE = ("`−name`: a feature whose lower values mean acceptance (e.g. entropy) is scored negated, "
                  "so every AUC reads higher = better; report.json keeps the raw value's AUC as `auc_raw` "
                  "(= 1 − AUC).")


def _table(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def to_markdown(report: dict) -> str:
    if report.get("kind") == "cache-only":
        return _cache_only_markdown(report)
    runs = ", ".join(f"`{r['run']}`" for r in report["runs"])
    sampling = report["runs"][0].get("sampling") or {}
    lines = ["# svt evaluation report\n",
             f"Runs: {runs}. Sampling: temperature {sampling.get('temperature')}, top-p "
             f"{sampling.get('top_p')}. svt {report['svt_version']}, {report['created']}.\n",
             f"Labelled drafts: {report['acceptance']['labelled']:,}; acceptance rate "
             f"{report['acceptance']['rate']:.4f}; mean acceptance length (incl. the bonus token) "
             f"{report['acceptance']['mean_acceptance_length']:.3f}.\n",
             "Metrics on hard labels (drafts with a label). `—` = undefined: log-loss, ECE and Brier "
             "need a probability (features marked *probability: no* need a fitted predictor); AUC "
             "needs both classes. ECE: 10 equal-width bins. Brackets: 95% request-level bootstrap "
             "intervals. " + DIRECTION_NOTE + "\n"]
    header = ["feature", "lossless", *HEAD]
    feats = report["features"]
    lines += ["## All positions\n", _table(header, feature_rows(feats)), ""]
    lines += ["## Excluding the first draft position\n", _table(header, feature_rows(feats, "excluding_first")), ""]
    positions = sorted({int(p) for f in feats.values() for p in f["per_position"]})
    lines += ["## AUC by draft position\n",
              _table(["feature", *map(str, positions)],
                     [[shown(n, f), *(fmt(f["per_position"].get(p, f["per_position"].get(str(p), {})).get("auc")) for p in positions)]
                      for n, f in feats.items()]), ""]
    prob = {n: f for n, f in feats.items() if f["probability"]}
    if prob:
        lines += ["## ECE by draft position (probability scores)\n",
                  _table(["feature", *map(str, positions)],
                         [[n, *(fmt(f["per_position"].get(p, f["per_position"].get(str(p), {})).get("ece")) for p in positions)]
                          for n, f in prob.items()]), ""]
    lines += ["## Soft labels\n",
              "AUC and (for probabilities) log-loss against `accept_prob` (min(1, p/q) of the drawn "
              "token) and `accept_prob_expected` (1 − TV(p, q)): lower-variance labels.\n",
              _table(["feature", "AUC vs accept_prob", "log-loss vs accept_prob",
                      "AUC vs 1−TV", "log-loss vs 1−TV"],
                     [[shown(n, f), fmt(f["soft"]["accept_prob"]["auc"]), fmt(f["soft"]["accept_prob"]["log_loss"]),
                       fmt(f["soft"]["accept_prob_expected"]["auc"]),
                       fmt(f["soft"]["accept_prob_expected"]["log_loss"])] for n, f in feats.items()]), ""]
    lines += ["## Acceptance by draft position\n",
              "Conditional = accepted / verified at the position (the chain reached it); marginal = "
              "accepted / proposed.\n",
              _table(["position", "proposed", "verified", "accepted", "conditional", "marginal"],
                     [[str(r["position"]), fmt(r["proposed"]), fmt(r["verified"]), fmt(r["accepted"]),
                       fmt(r["conditional"]), fmt(r["marginal"])] for r in report["acceptance"]["by_position"]]),
              ""]
    if report.get("length_calibration"):
        lines += ["## Expected accepted length per step\n",
                  "Predicted = sum over positions of the cumulative product of the confidences (what "
                  "Adaptive Verification's budget rule sums); realised = accepted drafts in the step.\n",
                  _table(["predictor", "steps", "mean predicted", "mean realised", "length ECE"],
                         [[n, fmt(c["steps"]), fmt(c["mean_predicted"]), fmt(c["mean_realised"]),
                           fmt(c["length_ece"])] for n, c in report["length_calibration"].items()]), ""]
    if report.get("lossless_bias"):
        lines += ["## Losslessness bias of trimming\n",
                  "Rule: do not verify a draft when feature < threshold (the feature's median). Bias = "
                  "total-variation distance between the resulting output distribution and the target's, "
                  "over the positions logged in `dists/`.\n",
                  _table(["feature", "lossless", "threshold", "positions", "mean bias", "max bias"],
                         [[n, fmt(b["lossless"]), fmt(b["threshold"]), fmt(b["positions"]),
                           fmt(b["mean_bias"], 6), fmt(b["max_bias"], 6)]
                          for n, b in report["lossless_bias"].items()]), ""]
    else:
        lines += ["## Losslessness bias of trimming\n", "Not computed: the run has no `dists/` table "
                  "(collect with `log.dists_fraction` > 0).\n"]
    sim = report.get("simulation")
    if sim:
        lines += ["## End to end: Adaptive Verification replay\n",
                  f"Costs: `{sim['costs']['path']}` ({sim['costs']['kind']}; {sim['costs']['drafter']} drafter). "
                  f"{sim['costs']['description']}\n",
                  f"{sim['requests']} requests, {sim['request_steps']:,} request-steps, K = {sim['k']}. Policies: "
                  "fixed draft lengths, AV at K with each predictor, and an oracle that knows the accepted "
                  "runs (an upper bound on throughput). Interactivity = tokens/s per request; throughput = "
                  "tokens/s in all; Pareto = no other policy's point is better on both (the oracle is left "
                  "out of that comparison). The replay ignores trimming's feedback "
                  "on later states.\n",
                  _table(["policy", "B", "tokens/step", "step ms", "interactivity", "throughput", "Pareto"],
                         [[p["policy"], str(p["concurrency"]), fmt(p["tokens_per_step"], 3), fmt(p["step_ms"], 2),
                           fmt(p["interactivity"], 1), fmt(p["throughput"], 1),
                           "bound" if p["pareto"] is None else ("yes" if p["pareto"] else "")]
                          for p in sim["points"]]), ""]
        rules = sim.get("rules")
        if rules and any("engine_flip" in r for r in rules):
            lines += ["### Is the budget rule lossless on this cost table?\n",
                      "AV above uses the **lossless** budget rule: the document's rule applied to the greatest "
                      "convex minorant of the verify-cost curve, so every decision depends only on survivals "
                      "ranked above it (causal). The document's own rule on the measured curve (the "
                      "`[engine rule]` rows) can decide whether to verify a draft from the same request's later "
                      "confidences, which depend on the drafted token: lossy. Non-convexity: the largest gap "
                      "between the curve and its convex minorant over a step's token range, relative to the "
                      "cost. Flip rate: share of draft decisions that change when only the request's later "
                      "confidences are replaced (0.01 or 0.99), on sampled steps.\n",
                      _table(["B", "non-convexity", "engine-rule flips", "lossless-rule flips",
                              "throughput (lossless)", "throughput (engine rule)", "given up"],
                             [[str(r["concurrency"]), fmt(r["non_convexity"], 4),
                               f"{r['engine_flip']['flips']}/{r['engine_flip']['decisions']}",
                               f"{r['convex_flip']['flips']}/{r['convex_flip']['decisions']}",
                               fmt(r["throughput_convex"], 1), fmt(r["throughput_engine"], 1),
                               f"{100 * r['throughput_given_up']:.2f} %"] for r in rules]), ""]
        live = sim.get("live_check")
        if live:
            lines += ["### Live check\n",
                      f"Live AV run `{live['run']}` (fit `{live['fit']}`, batch {live['batch_size']}, "
                      f"{live['trimmed_steps']:,} trimmed steps): **{live['live_tokens_per_step']:.3f}** tokens "
                      f"per step live against **{live['replayed_tokens_per_step']:.3f}** replayed on the complete "
                      f"trace at B = {live['batch_size']}; gap {live['gap']:+.3f}. {live['note']}.\n"]
    lines += _hvd_markdown(report)
    lines += _map_markdown(report)
    lines += _realism_markdown(report)
    for g, parts in report.get("groups", {}).items():
        names = list(report["features"])
        lines += [f"## AUC by {g}\n",
                  _table(["feature", *parts], [[n, *(fmt(parts[k][n]["auc"]) for k in parts)] for n in names]),
                  ""]
        lines += [f"## Acceptance rate and count by {g}\n",
                  _table([g, "labelled", "acceptance"],
                         [[k, fmt(next(iter(v.values()))["n"]), fmt(next(iter(v.values()))["accept_rate"])]
                          for k, v in parts.items()]), ""]
    lines += _figures_markdown(report)
    return "\n".join(lines) + "\n"


def _figures_markdown(report: dict) -> list[str]:
    lines: list[str] = []
    if report.get("figures"):
        lines += ["## Figures\n", *(f"![{Path(f).stem}]({f})\n" for f in report["figures"])]
    for other in report.get("related") or []:
        lines += [f"## Related report: [{other['report']}]({other['report']})\n",
                  *(f"![{Path(f).stem}]({f})\n" for f in other["figures"])]
    return lines


def _cache_only_markdown(report: dict) -> str:
    runs = ", ".join(f"`{r['run']}`" for r in report["runs"])
    lines = ["# svt evaluation report (cache drafts only)\n",
             f"Runs: {runs}. svt {report['svt_version']}, {report['created']}.\n",
             f"**{report['note']}**\n"]
    for info, drafter in zip(report["runs"], report.get("drafters") or [], strict=False):
        who = f"`{info['run']}`: " if len(report["runs"]) > 1 else ""
        if drafter.get("kind") == "stand-in":
            lines.append(f"{who}Model drafter: **a stand-in** (conditional acceptance by position "
                         f"{', '.join(f'{a:.3f}' for a in drafter['accept'])}, {drafter['source']}; "
                         f"{drafter['tokens_per_cycle']:.2f} tokens per cycle expected). {drafter['note']}.\n")
        elif drafter.get("kind") == "model":
            lines.append(f"{who}Model drafter: `{drafter['path']}`, {drafter['note']}.\n")
    lines += _hvd_markdown(report)
    lines += _map_markdown(report)
    lines += _realism_markdown(report)
    lines += _figures_markdown(report)
    return "\n".join(lines) + "\n"


def _map_markdown(report: dict) -> list[str]:
    lines: list[str] = []
    hmap = report.get("hvd_map") or {}
    if hmap.get("rows"):
        lines += ["## Where HVD pays off: the map across drafter strengths\n",
                  f"The model drafter replaced by a stand-in at each strength (tokens per cycle = 1 + a + ... + "
                  f"a^K, the same conditional acceptance a at every position, drawn per position with seed "
                  f"{hmap['seed']}); yield predictor `{hmap['predictor']}`; {hmap['split']}. Gain: time of the "
                  "better single source (model-only or cache-only) over HVD's, minus 1.\n",
                  _table(["strength (tok/cycle)", "group", "τ", "greedy", "model-only", "cache-only", "HVD",
                          "oracle", "HVD speed-up", "HVD gain vs best single"],
                         [[fmt(r["strength"], 2), r["group"], fmt(r["tau"]),
                           *(fmt(r[p]["cycles_per_1000"], 1) for p in ("greedy", "model-only", "cache-only", "hvd",
                                                                       "oracle-switch")),
                           fmt(r["hvd"]["speedup_vs_greedy"], 3), fmt(r["hvd_gain_over_best_single"], 3)]
                          for r in hmap["rows"]]),
                  "\nColumns greedy .. oracle: cycles per 1000 tokens.\n"]
    elif hmap.get("note"):
        lines += ["## Where HVD pays off\n", f"Not computed: {hmap['note']}.\n"]
    two = report.get("two_sided") or {}
    if two.get("groups"):
        lines += ["## Two-sided switch (beyond the document)\n",
                  f"The model drafter's yield predicted too ({two['regressor']} on causal features: "
                  f"{', '.join(two['features'])}; held-out MSE {fmt(two['model_yield_mse'], 3)} against the "
                  f"yield variance {fmt(two['model_yield_var'], 3)}); the cache draft is verified when its predicted "
                  "tokens per ms beat the drafter's times a margin chosen like τ. On this run's own model-drafter "
                  f"yields; {two['split']}. An optimistic bound: the features assume the drafter's agreement is "
                  "observed at every position, where a live system sees it only where the drafter ran.\n",
                  _table(["group", "requests", "greedy cyc/1000", "one-sided cyc/1000", "two-sided cyc/1000",
                          "oracle cyc/1000", "one-sided speed-up", "two-sided speed-up", "oracle speed-up"],
                         [[g, fmt(b["requests"]), fmt(b["greedy_cycles_per_1000"], 1),
                           fmt(b["one_sided"]["cycles_per_1000"], 1), fmt(b["two_sided"]["cycles_per_1000"], 1),
                           fmt(b["oracle"]["cycles_per_1000"], 1), fmt(b["one_sided"]["speedup_vs_greedy"], 3),
                           fmt(b["two_sided"]["speedup_vs_greedy"], 3), fmt(b["oracle"]["speedup_vs_greedy"], 3)]
                          for g, b in two["groups"].items()]), ""]
    checks = report.get("document_checks")
    if checks:
        rows = []
        if "hvd_vs_greedy" in checks:
            c = checks["hvd_vs_greedy"]
            rows.append(["HVD faster than greedy", f"{c['better']} of {c['pairs']} (workload, strength) pairs",
                         c["document"]])
            c = checks["hvd_vs_cache_only"]
            rows.append(["HVD faster than cache-only", f"{c['better']} of {c['pairs']} ({c['ties']} ties)",
                         c["document"]])
        if "high_yield" in checks:
            c = checks["high_yield"]
            rows.append([f"precision / recall at yield >= {c['threshold']} ({c['predictor']})",
                         f"{fmt(c['precision'], 3)} / {fmt(c['recall'], 3)}", c["document"]])
        if "cycles_per_1000" in checks:
            c = checks["cycles_per_1000"]
            rows.append(["cycles per 1000 tokens, model-only against HVD",
                         f"{fmt(c['model_only'], 1)} against {fmt(c['hvd'], 1)}", c["document"]])
        if "top10_token_share" in checks:
            rows.append(["accepted tokens carried by the top 10 % of cache drafts",
                         ", ".join(f"{g} {fmt(v, 2)}" for g, v in checks["top10_token_share"].items()),
                         checks["top10_document"]])
        lines += ["## The document's checks, side by side\n", _table(["check", "here", "the document"], rows), ""]
    return lines


def _realism_markdown(report: dict) -> list[str]:
    realism = report.get("realism")
    if not realism:
        return []
    lines = ["## How far the pair is from the data (realism)\n",
             "Per workload: the mean common prefix of the output with the prompt's reference (task following), "
             "and the share of positions whose next 8 tokens already occurred before them in prompt + output "
             "(copying) and in the output alone (looping), for the output and for the reference text. The "
             "cache columns put the run's cache statistics beside a reference run's of the same prompts.\n"]
    for name, block in realism.items():
        ref_cache = block.get("reference_cache") or {}
        cache = block.get("cache") or {}
        rows = []
        for g, w in block["workloads"].items():
            c, rc = cache.get(g) or {}, ref_cache.get(g) or {}
            rows.append([g, fmt(w["requests"]), fmt(w["mean_common_prefix"], 1),
                         fmt(w["output_repeats_prompt_or_output"], 3), fmt(w["output_repeats_output"], 3),
                         fmt(w["reference_repeats_prompt_or_output"], 3), fmt(w["reference_repeats_output"], 3),
                         fmt(c.get("mean_yield"), 2), fmt(rc.get("mean_yield"), 2),
                         fmt(c.get("top10_token_share"), 2), fmt(rc.get("top10_token_share"), 2)])
        lines += [f"### `{name}` ({block['kind']} run)\n",
                  _table(["group", "requests", "common prefix", "output: repeats prompt+output",
                          "output: repeats itself", "reference: repeats prompt+output", "reference: repeats itself",
                          "cache yield (run)", "cache yield (reference)", "top-10% share (run)",
                          "top-10% share (reference)"], rows), ""]
    return lines


def _hvd_markdown(report: dict) -> list[str]:
    lines: list[str] = []
    cache = report.get("cache")
    if cache:
        lines += ["## Cache drafts (SuffixDecoding): opportunity\n",
                  "Share of decode positions where the cache proposes a draft, its mean length and oracle "
                  "yield (common prefix with the target's greedy continuation), the model drafter's mean "
                  "yield at the same positions, and how concentrated the high-yield drafts are: their share "
                  "of drafts and of the tokens all cache drafts would have accepted, and the share of those "
                  "tokens carried by the top 10 % of drafts.\n",
                  _table(["group", "positions", "with draft", "mean draft len", "mean cache yield", "yield 0",
                          "mean model yield", "high-yield drafts", "their token share", "top-10% token share",
                          "from global tree"],
                         [[g, fmt(c["positions"]), fmt(c["draft_share"], 3), fmt(c["mean_draft_len"], 2),
                           fmt(c["mean_yield"], 3), fmt(c.get("zero_yield_share"), 3), fmt(c["mean_model_yield"], 3), fmt(c["high_yield_share"], 3),
                           fmt(c["high_yield_token_share"], 3), fmt(c["top10_token_share"], 3),
                           fmt(c["from_global_share"], 3)] for g, c in cache.items()]), ""]
    yl = report.get("yield")
    if yl:
        head = ["predictor", "kind", "MSE", "MAE", "precision", "recall", "F1", "AP", "drafts"]

        def row(n, b, kind=""):
            return [n, kind, fmt(b["mse"], 3), fmt(b["mae"], 3), fmt(b["precision"], 3), fmt(b["recall"], 3),
                    fmt(b["f1"], 3), fmt(b["average_precision"], 3), fmt(b["n"])]

        lines += [f"## Yield predictors (high yield = accepted length >= {yl['high_yield']})\n",
                  f"Scored on the cache drafts of {yl['requests']} requests that every yield fit holds out. "
                  "Precision / recall / F1: predicted >= threshold against oracle >= threshold; AP: average "
                  "precision of the ranking. Rules are raw statistics in tokens (no fit).\n",
                  _table(head, [row(n, b, b["kind"]) for n, b in yl["predictors"].items()]), ""]
        for g, blocks in yl["groups"].items():
            lines += [f"### {g}\n", _table(head, [row(n, b) for n, b in blocks.items()]), ""]
    sim = report.get("hvd")
    if sim:
        lines += ["## End to end: Hybrid Verified Decoding replay\n",
                  f"Costs: `{sim['costs']['path']}` ({sim['costs']['kind']}). {sim['requests']} requests walked "
                  f"from position 0 at batch 1, K = {sim['k']}; a cycle advances by accepted + 1. Model cycles pay "
                  "K draft passes and verify(1 + K); cache cycles pay their measured lookup and verify(1 + draft "
                  "length); the oracle switch knows both yields (a bound). Best τ is chosen on these same "
                  "requests (optimistic).\n",
                  _table(["group", "policy", "cycles / 1000 tok", "tokens / cycle", "cache cycles",
                          "speed-up vs greedy", "vs model-only"],
                         [[r["group"], r["policy"], fmt(r["cycles_per_1000"], 1), fmt(r["mean_accepted_length"], 3),
                           fmt(r["cache_share"], 3), fmt(r["speedup_vs_greedy"], 3), fmt(r["speedup_vs_model"], 3)]
                          for r in sim["rows"] if "predictor" not in r]), "",
                  "### Best τ per predictor\n",
                  _table(["group", "predictor", "τ", "cycles / 1000 tok", "cache cycles", "speed-up vs greedy",
                          "vs model-only"],
                         [[b["group"], b["predictor"], fmt(b["tau"]), fmt(b["cycles_per_1000"], 1),
                           fmt(b["cache_share"], 3), fmt(b["speedup_vs_greedy"], 3), fmt(b["speedup_vs_model"], 3)]
                          for b in sim["best"]]), ""]
        lc = sim.get("live_check")
        if lc:
            lines += ["### Live check\n",
                      f"Live HVD run (fit `{lc['fit']}`, τ = {lc['tau']}): **{lc['live_cycles']}** cycles "
                      f"({lc['live_cycles_per_1000']:.1f} per 1000 tokens) live against **{lc['replayed_cycles']}** "
                      f"replayed on its own trace: {'equal' if lc['equal'] else 'DIFFERENT'}.\n"]
    return lines


def link_figures(report_dir: str | Path, figures: list[Path], related: list[str | Path] = ()) -> None:
    """Record the figures (and other reports, with their figures) in report.json and re-render
    report.md with a Figures section."""
    report_dir = Path(report_dir)
    report = read_json(report_dir / "report.json", "Report")
    report["figures"] = [str(Path(f).relative_to(report_dir)) for f in figures]
    rel = []
    for other in related:
        other = Path(other)
        if not (other / "report.json").is_file():
            raise DataError(f"{other}: not a report directory (no report.json) to link.")
        figs = read_json(other / "report.json", "Report").get("figures") or []
        rel.append({"report": os.path.relpath(other / "report.md", report_dir),
                    "figures": [os.path.relpath(other / f, report_dir) for f in figs]})
    report["related"] = rel
    write_report(report, report_dir)


def write_report(report: dict, out_dir: str | Path) -> tuple[Path, Path]:
    """report.json and report.md, each written to a temporary name and renamed."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{out} is a file; --out takes a report directory.")
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, text in (("report.json", json_text(report)),
                       ("report.md", to_markdown(report))):
        paths.append(write_text_atomic(out / name, text))
    return paths[0], paths[1]
