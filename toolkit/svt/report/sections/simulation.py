"""End to end: the Adaptive Verification replay of the run's steps under a cost table (fixed draft
lengths, AV per predictor, an oracle) across concurrency, the budget rule's losslessness on that
table, and a live-AV run checked against its replay."""

from __future__ import annotations

from pathlib import Path

from svt.report.judge import costs_match, judge, keyed, metric_value, missing_row
from svt.report.scoring import simulation
from svt.report.sections.base import Judging, ReportContext, Section
from svt.report.text import add_row, cost_warnings, fmt, md_table, new_table


class Simulation(Section):
    name = "AV replay"

    def compute(self, ctx: ReportContext, report: dict) -> dict:
        live_hvd = any(i["experiment"]["engine"] == "svt live HVD" for i in ctx.infos)
        if not ctx.opts.costs or live_hvd:
            return {"simulation": None}
        from svt.traces.io import read_meta

        metas = [read_meta(Path(i["path"])) for i in ctx.infos if i.get("path")]
        from svt.report.scoring import request_outputs

        return {"simulation": simulation(ctx.drafts, ctx.feats, ctx.opts, metas, request_outputs(ctx.runs))}

    def markdown(self, report: dict) -> list[str]:
        sim = report.get("simulation")
        if not sim:
            return []
        lines: list[str] = []
        lines += ["## End to end: Adaptive Verification replay\n",
                  f"Costs: `{sim['costs']['path']}` ({sim['costs']['kind']}; {sim['costs']['drafter']} drafter). "
                  f"{sim['costs']['description']}\n",
                  *cost_warnings(sim["costs"]), *_beyond_lines(sim),
                  f"{sim['requests']} requests, {sim['request_steps']:,} request-steps, K = {sim['k']}. Policies: "
                  "fixed draft lengths, AV at K with each predictor, and an oracle that knows the accepted "
                  "runs (a bound on per-step choices, on the trace's own steps: each other policy runs its own "
                  "steps, as many as its requests' lengths take, and one that emits fewer tokens a step keeps "
                  "its batches fuller, so at a large batch it can pass the oracle). Interactivity = tokens/s per request; throughput = "
                  "tokens/s in all; Pareto = no other policy's point is better on both (the oracle is left "
                  "out of that comparison). The replay ignores trimming's feedback "
                  "on later states.\n",
                  *_refit_lines(sim), _points_table(sim), ""]
        rules = sim.get("rules")
        if rules and any("engine_flip" in r for r in rules):
            lines += ["### Is the budget rule lossless on this cost table?\n",
                      "AV above uses the **lossless** budget rule: the rule of the document *Adaptive Verification "
                      "without a confidence head* applied to the greatest "
                      "convex minorant of the verify-cost curve, so every decision depends only on survivals "
                      "ranked above it (causal). That document's own rule on the measured curve (the "
                      "`[engine rule]` rows) can decide whether to verify a draft from the same request's later "
                      "confidences, which depend on the drafted token: lossy. Non-convexity: the largest gap "
                      "between the curve and its convex minorant over a step's token range, relative to the "
                      "cost. Flip rate: share of draft decisions that change when only the request's later "
                      "confidences are replaced (0.01 or 0.99), on sampled steps.\n",
                      md_table(["B", "non-convexity", "engine-rule flips", "lossless-rule flips",
                              "throughput (lossless)", "throughput (engine rule)", "given up"],
                             [[str(r["concurrency"]), fmt(r["non_convexity"], 4),
                               f"{r['engine_flip']['flips']}/{r['engine_flip']['decisions']}",
                               f"{r['convex_flip']['flips']}/{r['convex_flip']['decisions']}",
                               fmt(r["throughput_convex"], 1), fmt(r["throughput_engine"], 1),
                               "—" if r["throughput_given_up"] is None else f"{100 * r['throughput_given_up']:.2f} %"]
                              for r in rules]), ""]
        live = sim.get("live_check")
        if live:
            lines += ["### Live check\n",
                      f"Live AV run `{live['run']}` (fit `{live['fit']}`, batch {live['batch_size']}, "
                      f"{live['trimmed_steps']:,} trimmed steps): **{live['live_tokens_per_step']:.3f}** tokens "
                      f"per step live against **{live['replayed_tokens_per_step']:.3f}** replayed on the complete "
                      f"trace at B = {live['batch_size']}; gap {live['gap']:+.3f}. {live['note']}.\n"]
        lines += _live_lines(sim.get("live"))
        return lines

    def console(self, report: dict, concurrency=(1, 8, 64)) -> list:
        sim = report.get("simulation")
        if not sim:
            return []
        t = new_table("policy", "B", "tokens/step", "step ms", "tok/s per request", "tok/s total", "Pareto",
                      title=f"Adaptive Verification replay ({sim['costs']['kind']} costs"
                            f"{', UNRELIABLE' if sim['costs'].get('warnings') else ''})")
        for p in sim["points"]:
            if p["concurrency"] in concurrency:
                add_row(t, p["policy"], p["concurrency"], f"{p['tokens_per_step']:.3f}", f"{p['step_ms']:.2f}",
                        f"{p['interactivity']:,.0f}", f"{p['throughput']:,.0f}",
                        "bound" if p["pareto"] is None else ("yes" if p["pareto"] else ""))
        return [t]

    def compare(self, base: dict, now: dict, judging: Judging) -> list[dict]:
        return _replay_rows(base, now, judging.tolerances, judging.skipped, judging.paired)


def _live_lines(live: dict | None) -> list[str]:
    """The live runs beside the replay (svt.report.live)."""
    if not live:
        return []

    def f(v, d=2):
        return "—" if v is None else f"{v:,.{d}f}"

    rows = [[r["run"], r["policy"], str(r["batch_size"]), r["schedule"], f(r["mean_batch"]),
             f(r.get("waiting_mean_batch")), f(r.get("replay_mean_batch")), f(r["live_tokens_per_s"], 0),
             f(r["replay_tokens_per_s"], 0), f(r["ratio"]), f(r.get("ratio_at_run_speed")), f(r["live_tokens_per_step"], 3),
             f(r["replay_tokens_per_step"], 3), f(r["table_vs_steps"]), f(r["table_vs_forwards"]),
             f(r["step_vs_forwards"]), f(r.get("cache_width"), 0), f(r["prefill_s"])] for r in live["runs"]]
    lines = ["### How close is the replay? Live runs of the same policies\n",
             live["note"] + "\n",
             md_table(["live run", "policy", "B", "schedule", "mean batch", "while requests wait", "replay mean batch",
                       "live tok/s",
                       "replay tok/s",
                       "replay / live", "at the run's speed", "live tok/step", "replay tok/step", "table / steps",
                       "table / forwards",
                       "step / forwards", "cache width", "prefill s"], rows), ""]
    notes = [f"- `{r['run']}`: {r['schedule_note']}" for r in live["runs"] if r.get("schedule_note")]
    if notes:
        lines += [*notes, ""]
    multi = [p for p in live["points"] if p["rounds"] > 1]
    if multi:
        def rng(st, d=2):
            return "—" if st is None else f"{st['median']:,.{d}f} [{st['min']:,.{d}f}-{st['max']:,.{d}f}]"

        lines += ["Rounds of one point: median [range].\n",
                  md_table(["policy", "B", "rounds", "replay / live", "at the run's speed", "live tok/s", "replay tok/s",
                            "table / steps", "step / forwards"],
                           [[p["policy"], str(p["batch_size"]), str(p["rounds"]), rng(p["ratio"]),
                             rng(p.get("ratio_at_run_speed")),
                             rng(p["live_tokens_per_s"], 0), rng(p["replay_tokens_per_s"], 0),
                             rng(p["table_vs_steps"]), rng(p["step_vs_forwards"])] for p in multi]), ""]
    return lines


def _replay_rows(base, now, tolerances, skipped, paired=False):
    b, n = base.get("simulation"), now.get("simulation")
    if not b:
        if n:
            skipped.append("AV replay: only in the new report")
        return []
    bp = keyed(b["points"], lambda p: (str(p["policy"]), int(p["concurrency"])), "AV replay point")
    if n and not costs_match("AV replay", b, n, skipped):
        return []
    np_ = keyed(n["points"], lambda p: (str(p["policy"]), int(p["concurrency"])), "AV replay point") if n else {}
    rows = []
    for (policy, conc), p in bp.items():
        q = np_.get((policy, conc))
        for m in ("throughput", "interactivity"):
            base = metric_value(p[m], m)
            if base is None:
                skipped.append(f"AV replay {policy} B={conc} {m}: the baseline's value is not a valid number")
            elif q is None:
                rows.append(missing_row("AV replay", policy, f"B={conc}", m, "simulation", base))
            else:
                cis = (None, None) if paired else ((p.get("ci95") or {}).get(m), (q.get("ci95") or {}).get(m))
                rows.append({**judge(m, "simulation", base, metric_value(q.get(m), m), cis[0], tolerances, cis[1]),
                             "section": "AV replay", "item": policy, "where": f"B={conc}"})
    return rows


def _span(ci, digits: int) -> str:
    return "—" if not ci else f"[{fmt(ci[0], digits)}, {fmt(ci[1], digits)}]"


def _points_table(sim: dict) -> str:
    """The replay's points; with the cost model's refits, each point's 95 % range over them and its
    throughput over the best fixed draft length's, paired (a gain whose range holds 1 is not shown)."""
    refits = sim.get("cost_refits") or 0
    head = ["policy", "B", "tokens/step", "step ms", "interactivity", "throughput", "Pareto"]
    if refits:
        head += ["throughput 95 % (cost fit)", "x best fixed K (95 %, cost fit)"]
    rows = []
    for p in sim["points"]:
        row = [p["policy"], str(p["concurrency"]), fmt(p["tokens_per_step"], 3), fmt(p["step_ms"], 2),
               fmt(p["interactivity"], 1), fmt(p["throughput"], 1),
               "bound" if p["pareto"] is None else ("yes" if p["pareto"] else "")]
        if refits:
            ci = p.get("cost_ci95") or {}
            row += [_span(ci.get("throughput"), 1), _span(ci.get("vs_best_fixed"), 3)]
        rows.append(row)
    return md_table(head, rows)


def _refit_lines(sim: dict) -> list[str]:
    refits = sim.get("cost_refits") or 0
    if not refits:
        return []
    return [f"The cost model's uncertainty: every policy is replayed again on {refits} bootstrap refits of the cost "
            "fit (the profile's repeats resampled, the model refitted). The ranges are the 2.5 and 97.5 percentiles "
            "over those replays; `x best fixed K` is the policy's throughput over the best fixed draft length's at "
            "the same B, priced by the same refit each time, so a gain whose range lies above 1 holds whatever the "
            "costs' noise. The ranges do not include the requests' own sampling noise (`--replay-bootstrap`).\n",
            *decision_lines(sim["costs"].get("decisions") or [])]


def decision_lines(decisions: list[dict]) -> list[str]:
    """The verdict a user acts on: does each batch size's winner hold over the cost model's refits
    (within 2 % of each refit's best in at least 95 % of them)?"""
    if not decisions:
        return []

    def held(d):
        return (f"B = {d['concurrency']}: {d['winner']} (the pick of {d['agree']}/{d['refits']} refits, within 2 % "
                f"of the best in {d['within']})")

    doubt = [d for d in decisions if d["in_doubt"]]
    if not doubt:
        return ["**The costs hold for the decisions**: at every B the replay's best policy stays within 2 % of the "
                "best in at least 95 % of the cost model's refits (" + "; ".join(held(d) for d in decisions) + ").\n"]
    out = ["**The cost table puts decisions in doubt**: at these B the replay's best policy falls more than 2 % "
           "behind another in over 5 % of the cost model's refits, so which policy wins rests on the profile's "
           "noise; profile again on a quiet machine, or with more repeats, before acting on it."]
    for d in doubt:
        others = ", ".join(f"{p or 'none'} in {n}" for p, n in d["others"].items())
        cells = ", ".join(c["cell"] + ("" if c["interval95"] is None else f" (±{c['interval95']:.0%})")
                          for c in d.get("cells", [])[:4])
        out.append(f"- B = {d['concurrency']}: {d['winner']} is the pick of {d['agree']} of {d['refits']} refits "
                   f"({others}) and within 2 % of the best in {d['within']} (it gives up to "
                   f"{d['worst_regret']:.0%}); the cells they differ on, widest interval first: {cells}.")
    ok = [d for d in decisions if not d["in_doubt"]]
    if ok:
        out.append("- holding: " + "; ".join(held(d) for d in ok) + ".")
    return ["\n".join(out) + "\n"]


def _beyond_lines(sim: dict) -> list[str]:
    """What the chain replay read past its cost table, and concurrency above the run's requests."""
    out = []
    beyond = sim["costs"].get("beyond_table") or []
    if beyond:
        out.append("**The cost table does not cover this replay**: " + "; ".join(beyond) + ". Those costs are "
                   "extrapolated linearly; profile with larger `--profile-batches`.\n")
    top = max((p["concurrency"] for p in sim["points"]), default=0)
    if top > sim["requests"]:
        out.append(f"The replay holds {sim['requests']} requests (those every predictor may be scored on): rows "
                   f"with B above {sim['requests']} replay batches of {sim['requests']} (they repeat the figures of "
                   "the largest B at or below it).\n")
    return out
