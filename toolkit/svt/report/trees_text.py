"""A tree report as report.md lines and terminal tables (see :mod:`svt.report.trees`)."""

from __future__ import annotations

from svt.report.text import add_row, cost_warnings, fmt, md_table, new_table

DEPTH_HEAD = ["depth", "nodes", "verified", "accepted", "accepted given tried", "match rate", "mean q_token",
              "mean path prob"]
CAL_HEAD = ["predictor", "label", "n", "rate", "mean prediction", "AUC", "log-loss", "ECE"]
REPLAY_HEAD = ["policy", "budget", "nodes / step", "accepted / step", "accepted / verified node"]
E2E_HEAD = ["policy", "budget", "concurrency", "tok/s per request", "tok/s", "Pareto"]
WORKLOAD_HEAD = ["workload", "steps", "nodes / step", "accepted / step", "accepted / node"]


def _workload_rows(t: dict) -> list[list[str]]:
    return [[r["workload"], fmt(r["steps"]), fmt(r["nodes_per_step"], 2), fmt(r["accepted_per_step"], 3),
             fmt(r["accepted_per_node"], 3)] for r in t["by_workload"]]


def _depth_rows(t: dict) -> list[list[str]]:
    return [[str(r["depth"]), fmt(r["nodes"]), fmt(r["verified"]), fmt(r["accepted"]), fmt(r["conditional"]),
             fmt(r["match_rate"]), fmt(r["mean_q_token"]), fmt(r["mean_path_prob"])] for r in t["by_depth"]]


def _cal_rows(t: dict) -> list[list[str]]:
    return [[c["predictor"], c["label"], fmt(c["n"]), fmt(c["rate"]), fmt(c["mean_pred"]), fmt(c["auc"]),
             fmt(c["log_loss"]), fmt(c["ece"])] for c in t["calibration"]]


def _replay_rows(t: dict) -> list[list[str]]:
    return [[r["policy"], r["budget"], fmt(r["nodes_per_step"], 2), fmt(r["accepted_per_step"], 3),
             fmt(r["accepted_per_node"], 3)] for r in t["replay"] or []]


def _feature_lines(t: dict) -> list[str]:
    zoo = t.get("features")
    if not zoo or not zoo["rows"]:
        return []
    depths = sorted({d["depth"] for r in zoo["rows"] for d in r["by_depth"]})[:6]
    head = ["feature", "label", "lossless", "n", "AUC", *(f"AUC depth {d}" for d in depths), "ECE"]
    body = []
    for r in zoo["rows"]:
        at = {d["depth"]: d for d in r["by_depth"]}
        body.append([r["feature"], r["label"], "yes" if r["lossless"] else "no", fmt(r["n"]), fmt(r["auc"]),
                     *(fmt((at.get(d) or {}).get("auc")) for d in depths), fmt(r.get("ece"))])
    skipped = "; ".join(f"`{k}` {v}" for k, v in zoo["skipped"].items())
    return ["## The feature zoo on tree nodes\n",
            "Every registered feature a node has the columns for (a node's `q_token` read as the drafted token's "
            "q, its depth as the position), plus path probability and sibling rank, by AUC (each feature's "
            "direction applied) against `match` (greedy runs, every node) and against acceptance of the nodes "
            "verification tried; ECE for features that are probabilities."
            + (f" Not computed: {skipped}." if skipped else "") + "\n",
            md_table(head, body) + "\n"]


def best_per_concurrency(t: dict) -> list[dict]:
    """The fastest policy at each concurrency (by tokens/s), the best chain and the oracle's bound."""
    out = []
    rows = t["end_to_end"] or []
    for b in sorted({r["concurrency"] for r in rows}):
        at = [r for r in rows if r["concurrency"] == b]
        for kind in dict.fromkeys(r["policy"] for r in rows):
            cands = [r for r in at if r["policy"] == kind]
            if cands:
                out.append(max(cands, key=lambda r: r["throughput"]))
    return out


def _e2e_rows(t: dict) -> list[list[str]]:
    return [[r["policy"], r["budget"], str(r["concurrency"]), fmt(r["interactivity"], 1), fmt(r["throughput"], 1),
             "yes" if r["pareto"] else ""] for r in best_per_concurrency(t)]


def tree_markdown(report: dict) -> str:
    t = report["trees"]
    shape = t["shape"] or {}
    el = t["expected_length"]
    lines = ["# svt evaluation report: draft trees\n",
             f"Run: `{t['run']}`, {shape.get('shape')} trees"
             + (f" (up to {shape['nodes']} nodes, depth {shape['depth']}, {shape['proposals']} proposals)"
                if shape.get("nodes") else "")
             + f"; verification: {shape.get('verify')}. svt {report['svt_version']}, {report['created']}.\n",
             f"{shape.get('steps', 0):,} steps, {shape.get('tree_nodes', 0):,} nodes; "
             f"{fmt(shape.get('accepted_per_step'), 3)} accepted per step, "
             f"{fmt(shape.get('accepted_per_node'), 4)} per node.\n",
             *([f"**Covers {t['coverage']}**: with node fits given (`--fit`), every table below is computed on "
                "the requests they may be scored on; policy `fit NAME` grows trees by a fit's path product.\n"]
               if t.get("coverage") else []),
             "## By workload\n",
             md_table(WORKLOAD_HEAD, _workload_rows(t)) + "\n"]
    if not t["by_depth"]:
        lines.append("No per-node rows (an imported tree run: the source gives counts per step), so no depth "
                     "table, calibration or policy replay.\n")
        return "\n".join(lines) + "\n"
    lines += ["## Acceptance by depth\n",
             "`accepted given tried`: among the nodes verification tried (their parent accepted); `match rate` "
             "(greedy runs): the share of all nodes whose token is the target's argmax at their parent.\n",
             md_table(DEPTH_HEAD, _depth_rows(t)) + "\n",
             "## Calibration of node and path predictors\n",
             f"ECE over {report['settings']['n_bins']} equal-width bins. `on the accepted path`: label 1, "
             "unreached nodes counted 0 (what a path probability predicts). The cross-fitted predictor is a "
             "logistic regression of `match` on the node's q, entropy, path probability, depth and rank, "
             "fitted on half the requests and scored on the other half.\n",
             md_table(CAL_HEAD, _cal_rows(t)) + "\n"
             + (f"\nThe node predictor was {t['predictor_note']}, so it has no rows and no replay policy.\n"
                if t.get("predictor_note") else ""),
             *_feature_lines(t),
             "## Expected accepted length\n",
             f"The drafter's predicted expected accepted length of a tree (the sum of its path probabilities) "
             f"against the realised one, over {el['steps']:,} steps: predicted {fmt(el['mean_predicted'], 3)}, "
             f"realised {fmt(el['mean_realised'], 3)} (ratio {fmt(el['ratio'], 3)}, correlation "
             f"{fmt(el['correlation'], 3)})."
             + (" With sampled proposals siblings repeat tokens and the sum counts each copy, so it over-predicts; "
                "it is the expected accepted length only for distinct siblings (top proposals)."
                if shape.get("proposals") == "sampled" else "") + "\n",
             md_table(["predicted (bin mean)", "realised", "steps"],
                      [[fmt(b["predicted"], 3), fmt(b["realised"], 3), fmt(b["n"])] for b in el["bins"]]) + "\n"]
    if t["replay"] is None:
        lines.append("No policy replay: counterfactual trees are exact only under greedy verification (every node's "
                     "`match` is known); collect with `temperature: 0` to replay tree policies.\n")
        return "\n".join(lines) + "\n"
    lines += ["## Tree policies replayed on the logged trees\n",
              "Each policy's tree is a subtree of the logged one (a chain or shape the logged tree did not keep is "
              "cut where it stops; `nodes / step` counts what it verifies). Greedy verification of a subtree is "
              "exact offline.\n", md_table(REPLAY_HEAD, _replay_rows(t)) + "\n"]
    if t["end_to_end"]:
        lines += ["## End to end across concurrency\n",
                  f"Cost table `{t['costs']['path']}` ({t['costs']['kind']}): a drafter pass for the pending token and "
                  "one per level over the nodes it expands (read as one-token passes of batch x nodes rows), one "
                  "target pass over every row's pending token and tree, at each policy's mean tree shape. The best of each policy per concurrency by tokens/s; `Pareto`: on the "
                  "throughput-interactivity frontier of all non-oracle rows (report.json has every row).\n",
                  *cost_warnings(t["costs"]), md_table(E2E_HEAD, _e2e_rows(t)) + "\n"]
        beyond = (t["costs"] or {}).get("beyond_table") or []
        if beyond:
            lines.append("**The cost table does not cover this replay**: " + "; ".join(beyond) + ". Those costs are "
                         "extrapolated linearly; profile with `svt collect TREE_CONFIG --profile-costs` (it times "
                         "verification up to the tree's size) and larger `--profile-batches`.\n")
    return "\n".join(lines) + "\n"


def tree_console(report: dict) -> list:
    t = report["trees"]
    items = []
    for title, head, rows in (("trees by workload", WORKLOAD_HEAD, _workload_rows(t)),
                              ("acceptance by depth", DEPTH_HEAD, _depth_rows(t)),
                              ("calibration of node and path predictors", CAL_HEAD, _cal_rows(t)),
                              ("tree policies (greedy replay)", REPLAY_HEAD, _replay_rows(t)),
                              ("end to end: the best of each policy per concurrency"
                               + (", UNRELIABLE costs" if (t.get("costs") or {}).get("warnings") else ""),
                               E2E_HEAD, _e2e_rows(t))):
        if not rows:
            continue
        table = new_table(*head, title=title)
        for r in rows:
            add_row(table, *r)
        items.append(table)
    return items
