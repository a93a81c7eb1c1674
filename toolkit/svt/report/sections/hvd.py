"""Hybrid Verified Decoding: the cache drafts' opportunity, the yield predictors (MSE, MAE,
precision and recall of high-yield drafts), the HVD replay across τ against greedy, model-only,
cache-only and an oracle switch, the map across drafter strengths, and the document's checks."""

from __future__ import annotations

from svt.metrics.specs import names
from svt.report.judge import costs_match, judge, keyed, metric_value, missing_row
from svt.report.sections.base import Judging, ReportContext, Section
from svt.report.text import add_row, cost_warnings, fmt, md_table, new_table, with_request_ci
from svt.traces.io import open_run

HVD_PAPER = "Hybrid Verified Decoding: Learning to Allocate Verification in Speculative Decoding"


class Hvd(Section):
    name = "yield and HVD replay"

    def compute(self, ctx: ReportContext, report: dict) -> dict:
        has_cache = [open_run(r, deep=False, tables=["requests", "cache_drafts"]).has("cache_drafts")
                     for r in ctx.runs]
        if not (ctx.yield_fits or all(has_cache)):
            return {"cache": None, "yield": None, "hvd": None}
        from svt.report.hvd import hvd_report
        from svt.report.reference import document_checks

        out = hvd_report(list(ctx.runs), ctx.yield_fits, [i["run_id"] for i in ctx.infos],
                         costs_path=ctx.opts.costs, high_yield=ctx.opts.high_yield, seed=ctx.opts.seed,
                         n_bins=ctx.opts.n_bins)
        out["document_checks"] = document_checks({**report, **out})
        out["settings"] = {**report["settings"], "high_yield": ctx.opts.high_yield}
        return out

    def markdown(self, report: dict) -> list[str]:
        from svt.report.cache_trees import cache_tree_markdown

        return hvd_markdown(report) + cache_tree_markdown(report) + map_markdown(report)


    def console(self, report: dict) -> list:
        items = []
        if report.get("yield"):
            items.append(yield_table(report))
        if report.get("hvd"):
            items.append(hvd_table(report))
        if report.get("hvd_tree"):
            items.append(hvd_tree_table(report))
        return items

    def compare(self, base: dict, now: dict, judging: Judging) -> list[dict]:
        return (_yield_rows(base, now, judging.tolerances, judging.skipped)
                + _hvd_rows(base, now, judging.tolerances, judging.skipped))


def yield_table(report: dict):
    yl = report["yield"]
    t = new_table("predictor", "MSE", "MAE", "precision", "recall", "F1", "AP",
                  title=f"yield predictors: high yield >= {yl['high_yield']} ({yl['requests']} requests)")
    for n, b in yl["predictors"].items():
        add_row(t, n, *(fmt(b[k], 3) for k in names("yield", compared=True)))
    return t


def hvd_table(report: dict):
    hv = report["hvd"]
    t = new_table("group", "policy", "cycles/1000", "speed-up vs greedy", "vs model-only",
                  title=f"Hybrid Verified Decoding replay ({hv['costs']['kind']} costs, batch 1"
                        f"{', UNRELIABLE' if hv['costs'].get('warnings') else ''})")
    for r in hv["rows"]:
        if "predictor" not in r:
            add_row(t, r["group"], r["policy"], f"{r['cycles_per_1000']:.1f}", f"{r['speedup_vs_greedy']:.3f}",
                    f"{r['speedup_vs_model']:.3f}")
    for b in hv["best"]:
        add_row(t, b["group"], f"hvd {b['predictor']} best τ={b['tau']:g}", f"{b['cycles_per_1000']:.1f}",
                f"{b['speedup_vs_greedy']:.3f}", f"{b['speedup_vs_model']:.3f}")
    return t


def hvd_tree_table(report: dict):
    hv = report["hvd_tree"]
    t = new_table("policy", "cycles/1000", "tokens/cycle", "speed-up vs greedy",
                  title=f"HVD with tree cache drafts, all requests ({hv['costs']['kind']} costs, batch 1"
                        f"{', UNRELIABLE' if hv['costs'].get('warnings') else ''})")
    for r in hv["rows"]:
        if r["group"] == "all":
            add_row(t, r["policy"], f"{r['cycles_per_1000']:.1f}", f"{r['mean_accepted_length']:.3f}",
                    f"{r['speedup_vs_greedy']:.3f}")
    for b in hv["best"]:
        if b["group"] == "all":
            add_row(t, f"hvd {b['predictor']} best τ={b['tau']:g}", f"{b['cycles_per_1000']:.1f}", "",
                    f"{b['speedup_vs_greedy']:.3f}")
    return t


def hvd_markdown(report: dict) -> list[str]:
    lines: list[str] = []
    cache = report.get("cache")
    if cache:
        lines += ["## Cache drafts (SuffixDecoding): opportunity\n",
                  "**Covers all requests.** Share of decode positions where the cache proposes a draft, its mean length and oracle "
                  "yield (common prefix with the target's greedy continuation), the model drafter's mean "
                  "yield at the same positions, and how concentrated the high-yield drafts are: their share "
                  "of drafts and of the tokens all cache drafts would have accepted, and the share of those "
                  "tokens carried by the top 10 % of drafts.\n",
                  md_table(["group", "positions", "with draft", "mean draft len", "mean cache yield", "yield 0",
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
                  f"**Covers {yl.get('coverage') or str(yl['requests']) + ' requests'}.** "
                  "Precision / recall / F1: predicted >= threshold against oracle >= threshold; AP: average "
                  "precision of the ranking. Rules are raw statistics in tokens (no fit).\n",
                  md_table(head, [row(n, b, b["kind"]) for n, b in yl["predictors"].items()]), ""]
        for g, blocks in yl["groups"].items():
            lines += [f"### {g}\n", md_table(head, [row(n, b) for n, b in blocks.items()]), ""]
    sim = report.get("hvd")
    if sim:
        lines += ["## End to end: Hybrid Verified Decoding replay\n",
                  f"**Covers {sim.get('coverage') or str(sim['requests']) + ' requests'}.** "
                  f"Costs: `{sim['costs']['path']}` ({sim['costs']['kind']}). {sim['requests']} requests walked "
                  f"from position 0 at batch 1, K = {sim['k']}; a cycle advances by accepted + 1. Model cycles pay "
                  "K draft passes and verify(1 + K); cache cycles pay their measured lookup and verify(1 + draft "
                  "length); the oracle switch knows both yields (a bound). Best τ is chosen on these same "
                  "requests (optimistic).\n",
                  *cost_warnings(sim["costs"]),
                  *_request_note(sim),
                  *_refit_note(sim),
                  md_table(["group", "policy", "cycles / 1000 tok", "tokens / cycle", "cache cycles",
                          "speed-up vs greedy", "vs model-only", "vs cache-only", *_ci_head(sim)],
                         [[r["group"], r["policy"], with_request_ci(r, "cycles_per_1000", 1),
                           fmt(r["mean_accepted_length"], 3), fmt(r["cache_share"], 3),
                           *(with_request_ci(r, m) for m in ("speedup_vs_greedy", "speedup_vs_model",
                                                              "speedup_vs_cache")),
                           *_ci_cells(sim, r)]
                          for r in sim["rows"] if "predictor" not in r]), "",
                  "### Best τ per predictor\n",
                  md_table(["group", "predictor", "τ", "cycles / 1000 tok", "cache cycles", "speed-up vs greedy",
                          "vs model-only", "vs cache-only", *_ci_head(sim)],
                         [[b["group"], b["predictor"], fmt(b["tau"]), with_request_ci(b, "cycles_per_1000", 1),
                           fmt(b["cache_share"], 3),
                           *(with_request_ci(b, m) for m in ("speedup_vs_greedy", "speedup_vs_model",
                                                              "speedup_vs_cache")),
                           *_ci_cells(sim, b)]
                          for b in sim["best"]]), ""]
        lc = sim.get("live_check")
        if lc:
            lines += ["### Live check\n",
                      f"Live HVD run (fit `{lc['fit']}`, τ = {lc['tau']}): **{lc['live_cycles']}** cycles "
                      f"({lc['live_cycles_per_1000']:.1f} per 1000 tokens) live against **{lc['replayed_cycles']}** "
                      f"replayed on its own trace: {'equal' if lc['equal'] else 'DIFFERENT'}.\n"]
    return lines


def _ci_head(sim: dict) -> list[str]:
    return ["vs greedy 95 % (cost fit)", "vs model-only 95 % (cost fit)"] if sim.get("cost_refits") else []


def _ci_cells(sim: dict, row: dict) -> list[str]:
    if not sim.get("cost_refits"):
        return []
    ci = row.get("cost_ci95") or {}
    return ["—" if not ci.get(m) else f"[{fmt(ci[m][0], 3)}, {fmt(ci[m][1], 3)}]"
            for m in ("speedup_vs_greedy", "speedup_vs_model")]


def _request_note(sim: dict) -> list[str]:
    n = sim.get("request_bootstrap")
    if not n:
        return []
    return [f"Brackets after a value: its 2.5 and 97.5 percentiles over {n} request-level bootstrap resamples of the "
            "group's requests (every policy priced on the same resample; τ stays where it was chosen, so the best-τ "
            "rows' ranges leave out the choice's own optimism).\n"]


def _refit_note(sim: dict) -> list[str]:
    if not sim.get("cost_refits"):
        return []
    return [f"Ranges: 2.5 and 97.5 percentiles of each speed-up over replays on {sim['cost_refits']} bootstrap refits "
            "of the cost model (each refit prices both sides of the ratio); a speed-up whose range holds 1 is "
            "not shown by these costs.\n"]


def map_markdown(report: dict) -> list[str]:
    lines: list[str] = []
    hmap = report.get("hvd_map") or {}
    if hmap.get("rows"):
        lines += ["## Where HVD pays off: the map across drafter strengths\n",
                  f"The model drafter replaced by a stand-in at each strength (tokens per cycle = 1 + a + ... + "
                  f"a^K, the same conditional acceptance a at every position, drawn per position with seed "
                  f"{hmap['seed']}); yield predictor `{hmap['predictor']}`; {hmap['split']}. Gain: time of the "
                  "better single source (model-only or cache-only) over HVD's, minus 1.\n",
                  md_table(["strength (tok/cycle)", "group", "scored requests", "τ", "greedy", "model-only",
                          "cache-only", "HVD", "oracle", "HVD speed-up", "HVD gain vs best single", "95% interval"],
                         [[fmt(r["strength"], 2), r["group"], fmt(r.get("requests")) + (" (few)" if r.get("few_requests")
                                                                                          else ""), fmt(r["tau"]),
                           *(fmt(r[p]["cycles_per_1000"], 1) for p in ("greedy", "model-only", "cache-only", "hvd",
                                                                       "oracle-switch")),
                           fmt(r["hvd"]["speedup_vs_greedy"], 3), fmt(r["hvd_gain_over_best_single"], 3),
                           _interval(r)] for r in hmap["rows"]]),
                  "\nColumns greedy .. oracle: cycles per 1000 tokens. 95% interval: request-level bootstrap of the "
                  "gain over the scored requests (τ fixed where it was chosen); *spans 0* marks a gain that "
                  "cannot be told from none; *(few)*: fewer than 10 scored requests.\n"]
    elif hmap.get("note"):
        lines += ["## Where HVD pays off\n", f"Not computed: {hmap['note']}.\n"]
    two = report.get("two_sided") or {}
    if two.get("groups"):
        lines += [f"## Two-sided switch (beyond the document, *{HVD_PAPER}*)\n",
                  f"The model drafter's yield predicted too ({two['regressor']} on causal features: "
                  f"{', '.join(two['features'])}; held-out MSE {fmt(two['model_yield_mse'], 3)} against the "
                  f"yield variance {fmt(two['model_yield_var'], 3)}); the cache draft is verified when its predicted "
                  "tokens per ms beat the drafter's times a margin chosen like τ. On this run's own model-drafter "
                  f"yields; {two['split']}. An optimistic bound: the features assume the drafter's agreement is "
                  "observed at every position, where a live system sees it only where the drafter ran.\n",
                  md_table(["group", "requests", "greedy cyc/1000", "one-sided cyc/1000", "two-sided cyc/1000",
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
            on = f"; {c['split']}" if c.get("split") else ""
            rows.append(["HVD faster than greedy", f"{c['better']} of {c['pairs']} (workload, strength) pairs{on}",
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
            on = f" (on {c['requests']} requests: {c['split']})" if c.get("requests") and c.get("split") else ""
            rows.append(["cycles per 1000 tokens, model-only against HVD",
                         f"{fmt(c['model_only'], 1)} against {fmt(c['hvd'], 1)}{on}", c["document"]])
        if "top10_token_share" in checks:
            rows.append(["accepted tokens carried by the top 10 % of cache drafts",
                         ", ".join(f"{g} {fmt(v, 2)}" for g, v in checks["top10_token_share"].items()),
                         checks["top10_document"]])
        lines += ["## The document's checks, side by side\n",
                  f"The document: *{HVD_PAPER}*; its figures as it reports them, beside this report's.\n",
                  md_table(["check", "here", "the document"], rows), ""]
    return lines


def _interval(r: dict) -> str:
    ci = r.get("gain_interval")
    if not ci:
        return fmt(None)
    return f"[{ci[0]:.3f}, {ci[1]:.3f}]" + (" spans 0" if r.get("gain_interval_spans_zero") else "")


def _yield_rows(base, now, tolerances, skipped):
    b, n = base.get("yield"), now.get("yield")
    if not b:
        if n:
            skipped.append("yield predictors: only in the new report")
        return []
    preds_n = (n or {}).get("predictors") or {}
    rows = []
    for name, pb in b["predictors"].items():
        pn = preds_n.get(name)
        for m in names("yield", compared=True):
            if pb.get(m) is None:
                continue
            base = metric_value(pb[m], m)
            if base is None:
                skipped.append(f"yield {name} {m}: the baseline's value is not a valid number")
            elif pn is None:
                rows.append(missing_row("yield", name, "all requests", m, "yield", base))
            else:
                rows.append({**judge(m, "yield", base, metric_value(pn.get(m), m), None, tolerances),
                             "section": "yield", "item": name, "where": "all requests"})
    return rows


def _hvd_rows(base, now, tolerances, skipped):
    b, n = base.get("hvd"), now.get("hvd")
    if not b:
        if n:
            skipped.append("HVD replay: only in the new report")
        return []
    if n and not costs_match("HVD replay", b, n, skipped):
        return []
    fixed_b = keyed([r for r in b["rows"] if "predictor" not in r], lambda r: (r["group"], r["policy"]), "HVD row")
    best_b = keyed(b["best"], lambda r: (r["group"], r["predictor"]), "HVD best row")
    fixed_n = keyed([r for r in n["rows"] if "predictor" not in r], lambda r: (r["group"], r["policy"]),
                     "HVD row") if n else {}
    best_n = keyed(n["best"], lambda r: (r["group"], r["predictor"]), "HVD best row") if n else {}
    pairs = [(k[0], k[1], r, fixed_n.get(k)) for k, r in fixed_b.items()]
    pairs += [(k[0], f"hvd {k[1]} at its best τ", r, best_n.get(k)) for k, r in best_b.items()]
    rows = []
    for group, policy, rb, rn in pairs:
        base = metric_value(rb["speedup_vs_greedy"], "speedup_vs_greedy")
        if base is None:
            skipped.append(f"HVD {policy} ({group}): the baseline's speed-up is not a valid number")
            continue
        now_v = None if rn is None else metric_value(rn.get("speedup_vs_greedy"), "speedup_vs_greedy")
        rows.append({**judge("speedup_vs_greedy", "hvd", base, now_v, None, tolerances),
                     "section": "HVD replay", "item": policy, "where": group})
    return rows
