"""Mutation check: plant small realistic bugs in a copy of the package, one at a time, and run the
tests on each; a mutant the tests do not catch is a hole in the suite.

    python scripts/mutate.py [--only ID ...] [--full] [--list]

Each mutant replaces one exact snippet of one module (the snippet must occur exactly once). The
copy (``toolkit/`` and ``tests/``, with ``data/``, ``configs/`` and ``examples/`` linked) is imported first through
PYTHONPATH, checked to be the one under test, and passes its tests unmutated before any mutant
runs. By default each mutant runs the tests of its area (``tests``), stopping at the first
failure; ``--full`` runs the whole suite for each (slow). Prints a table of killed and surviving
mutants and writes reports/mutate.json. Exit status 1 when any mutant survives.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutant:
    id: str
    area: str  # the class of bug (the headings)
    file: str  # relative to toolkit/svt
    old: str
    new: str
    tests: tuple[str, ...]


M = Mutant
ENGINE = ("tests/collect/test_sampling.py", "tests/collect/test_engine.py")
MUTANTS = [
    # losslessness of speculative sampling
    M("resample-half-q", "losslessness", "collect/sampling.py", "residual = (p_at - q_at).clamp_min(0.0)",
      "residual = (p_at - 0.5 * q_at).clamp_min(0.0)", ENGINE),
    M("accept-scaled", "losslessness", "collect/sampling.py", "ok = u * q_x < p_x", "ok = u * q_x < 0.9 * p_x", ENGINE),
    M("nucleus-before-temperature", "losslessness", "collect/sampling.py",
      "    if temperature > 0:\n        logits = logits / temperature\n    probs = logits.softmax(-1)\n",
      "    probs = logits.softmax(-1)\n    if temperature > 0:\n        probs = (logits / temperature).softmax(-1) "
      "if top_p >= 1.0 else probs\n", ENGINE),
    M("bonus-from-q", "losslessness", "collect/sampling.py",
      "q_at = torch.cat([q, torch.zeros_like(q[:, :1])], 1)[rows, accepted]",
      "q_at = torch.cat([q, q[:, -1:]], 1)[rows, accepted]", ENGINE),
    # live AV trimming
    M("av-stop-off-by-one", "live AV", "collect/sampling.py", "stop = accepted >= kept", "stop = accepted > kept",
      ("tests/collect/test_sampling.py", "tests/collect/test_engine.py")),
    M("av-own-token-shifted", "live AV", "collect/sampling.py",
      "at_kept = p[torch.arange(B, device=p.device), kept.clamp(max=K)]",
      "at_kept = p[torch.arange(B, device=p.device), (kept - 1).clamp(min=0)]",
      ("tests/collect/test_sampling.py", "tests/collect/test_engine.py")),
    # report numbers
    M("ece-abs-per-row", "report numbers", "metrics/ordered.py",
      'out["ece"] = float(np.abs(gap).sum() / n)', 'out["ece"] = float(np.abs(gap).sum() / (n + 1))',
      ("tests/report", "tests/metrics")),
    M("bootstrap-by-row", "report numbers", "metrics/ordered.py",
      "_, group = np.unique(np.asarray(request), return_inverse=True)",
      "group = np.arange(np.asarray(request).size)", ("tests/report", "tests/metrics")),
    M("mean-acceptance-length", "report numbers", "report/scoring.py",
      "return (1 + accepted / steps if steps else float(\"nan\")), calib",
      "return (accepted / steps if steps else float(\"nan\")), calib", ("tests/report",)),
    M("length-calibration-sum", "report numbers", "report/scoring.py",
      '*[f.expr.cast(pl.Float64).cum_prod().sum().alias(f"_p{i}") for i, f in enumerate(feats)]',
      '*[f.expr.cast(pl.Float64).sum().alias(f"_p{i}") for i, f in enumerate(feats)]', ("tests/report",)),
    M("soft-label-swap", "report numbers", "metrics/ordered.py",
      "Pt = np.add.reduceat(rec[name], starts, dtype=np.float64)[:, None]",
      "Pt = W_all - np.add.reduceat(rec[name], starts, dtype=np.float64)[:, None]", ("tests/report", "tests/metrics")),
    # the one-sort score tables and the streamed paths (scale)
    M("auc-ties-count-whole", "scale", "metrics/ordered.py",
      'self.num[cols] += np.einsum("gj,gj->j", P, below + 0.5 * N)',
      'self.num[cols] += np.einsum("gj,gj->j", P, below + 1.0 * N)', ("tests/metrics", "tests/report")),
    M("auc-carry-dropped", "scale", "metrics/ordered.py", "below = self.neg[cols] + cn - N", "below = cn - N",
      ("tests/metrics", "tests/report")),
    M("mass-bins-by-row", "scale", "metrics/ordered.py",
      "idx = np.minimum(((self.before[cols] + cw - W) / self.totals[cols] * nb).astype(np.int64), nb - 1)",
      "idx = np.minimum(((self.before[cols] + cw) / self.totals[cols] * nb).astype(np.int64), nb - 1)",
      ("tests/metrics", "tests/report")),
    M("chunk-cuts-ties", "scale", "metrics/ordered.py",
      "        while b < n:  # skip the rest of the tie ending the chunk, a window at a time\n",
      "        while False:  # skip the rest of the tie ending the chunk, a window at a time\n", ("tests/metrics", "tests/report")),
    M("merged-float32-kept", "scale", "metrics/ordered.py", "            if down:  # a stable sort",
      "            if False:  # a stable sort", ("tests/metrics",)),
    M("same-ranks-ignores-ties", "fast loops", "metrics/ordered.py",
      "if not ((dv >= 0).all() and np.array_equal(dv > 0, up)):", "if not (dv >= 0).all():",
      ("tests/metrics/test_ordered.py",)),
    M("ordered-pass-shared-by-probability", "fast loops", "metrics/ordered.py",
      "if hit is not None and hit[0] is key and not probability:", "if hit is not None and hit[0] is key:",
      ("tests/metrics/test_ordered.py",)),
    M("float32-merge-unchecked", "fast loops", "metrics/ordered.py",
      "    return key, not exact and _merged(key, s)", "    return key, False", ("tests/metrics/test_ordered.py",)),
    M("merged-groups-first-only", "fast loops", "metrics/ordered.py",
      "groups = np.unique(hc[1:][ss[1:] < ss[:-1]])", "groups = np.unique(hc[1:][ss[1:] < ss[:-1]])[:1]",
      ("tests/metrics/test_ordered.py",)),
    M("family-blocks-misassigned", "fast loops", "report/scoring.py",
      "blocks.update(zip(family, done, strict=True))",
      "blocks.update(zip(sorted(family, reverse=True), done, strict=True))", ("tests/report/test_feature_families.py",)),
    # draft trees
    M("tree-residual-not-updated", "draft trees", "trees/verify.py",
      "            r = residual / mass if mass > 0 else r", "            r = r", ("tests/trees",)),
    M("tree-sampled-as-point-mass", "draft trees", "trees/verify.py",
      'if tree.mode == "sampled":\n                g = tree.dists[node]', 'if False:\n                g = tree.dists[node]',
      ("tests/trees",)),
    M("tree-bonus-from-parent", "draft trees", "trees/verify.py",
      "node, r = taken, p[1 + taken]", "node = taken", ("tests/trees",)),
    M("tree-greedy-match-own-row", "draft trees", "trees/verify.py",
      "match = tree.token == top[1 + tree.parent]", "match = tree.token == top[:-1]", ("tests/trees",)),
    M("tree-greedy-first-duplicate", "draft trees", "trees/verify.py",
      "node = int(hits[np.argmax(reach[hits])])", "node = int(hits[0])", ("tests/trees",)),
    M("tree-rerank-by-q-not-path", "draft trees", "trees/grow.py",
      "level = sorted(level, key=lambda i: (-prob[i], i))[:top_m]",
      "level = sorted(level, key=lambda i: (-prob[i] / pprob[parent[i]], i))[:top_m]", ("tests/trees",)),
    M("tree-rerank-keeps-first-grown", "draft trees", "trees/grow.py",
      "keep = sorted(range(len(token)), key=lambda i: (-prob[i], dep[i], i))[:n_nodes]",
      "keep = list(range(len(token)))[:n_nodes]", ("tests/trees",)),
    M("tree-mask-no-ancestors", "draft trees", "collect/tree_decode.py",
      "            a = int(tree.parent[a])\n", "            a = -1\n", ("tests/collect/test_tree_decode.py",)),
    M("tree-position-off-by-one", "draft trees", "collect/tree_decode.py",
      "pos = list(range(n, c)) + [c + int(d) for d in tree.depth]",
      "pos = list(range(n, c)) + [c + 1 + int(d) for d in tree.depth]", ("tests/collect/test_tree_decode.py",)),
    M("tree-draft-level-ignores-path", "draft trees", "collect/tree_decode.py",
      "                for j in range(1, len(path)):\n", "                for j in range(1, 1):\n",
      ("tests/collect/test_tree_decode.py",)),
    M("tree-cache-not-cropped", "draft trees", "collect/tree_decode.py",
      "    lm.crop(c)\n    rows", "    rows", ("tests/collect/test_tree_decode.py",)),
    M("tree-target-root-row-shifted", "draft trees", "collect/tree_decode.py",
      "rows = torch.cat([logits[t - 1:t], logits[t:]])", "rows = torch.cat([logits[t:t + 1], logits[t:]])",
      ("tests/collect/test_tree_decode.py",)),
    M("tree-engine-verifies-against-draft", "draft trees", "collect/tree_decode.py",
      "out = verify_greedy(tree, p) if greedy else verify_sampling(tree, p, draws)",
      "out = verify_greedy(tree, p) if greedy else verify_sampling(tree, np.vstack([tree.dists[-1], "
      "p[1:]]), draws)", ("tests/collect/test_tree_decode.py",)),
    M("tree-eos-not-stopped", "draft trees", "collect/tree_decode.py",
      "emitted, log.finish = emitted[:emitted.index(eos_id) + 1], \"stop\"",
      "log.finish = \"stop\"", ("tests/collect/test_tree_decode.py",)),
    M("tree-label-unreached-as-rejected", "draft trees", "collect/tree_run.py",
      "pl.col(\"label\").replace(-1, None),", "pl.col(\"label\").replace(-1, 0),", ("tests/collect/test_tree_run.py",)),
    M("tree-validator-parent-order", "draft trees", "traces/io.py",
      "(pl.col(\"parent\") >= pl.col(\"node\")).sum()", "(pl.col(\"parent\") > pl.col(\"node\")).sum()",
      ("tests/collect/test_tree_run.py",)),
    M("tree-replay-match-not-closed", "draft trees", "trees/replay.py",
      "        self.chain_ok = self.closed(self.match.astype(bool))", "        self.chain_ok = self.match.astype(bool)",
      ("tests/trees/test_replay.py",)),
    M("tree-replay-top-n-ignores-step", "draft trees", "trees/replay.py",
      "order = np.lexsort((self.node, self.depth, -score, self.step))",
      "order = np.lexsort((self.node, self.depth, -score))", ("tests/trees/test_replay.py",)),
    M("tree-replay-static-own-rank-only", "draft trees", "trees/replay.py",
      "return trees.closed(trees.rank < w[np.minimum(trees.depth, len(widths))])",
      "return trees.rank < w[np.minimum(trees.depth, len(widths))]", ("tests/trees/test_replay.py",)),
    M("tree-report-on-path-from-tried", "draft trees", "report/trees.py",
      "on_path = (nodes[\"label\"] == 1).fill_null(False)", "on_path = (nodes[\"label\"] >= 0).fill_null(False)",
      ("tests/report/test_trees.py",)),
    M("tree-report-verify-without-root", "draft trees", "report/trees.py",
      "costs.verify(np.array([batch * (1.0 + sum(nodes_by_depth))]))",
      "costs.verify(np.array([batch * sum(nodes_by_depth)]))", ("tests/report/test_trees.py",)),
    M("tree-report-pareto-with-oracle", "draft trees", "report/trees.py",
      "for o in real)", "for o in out)", ("tests/report/test_trees.py",)),
    M("segment-scope-position", "scale", "metrics/ordered.py", "scope(np.flatnonzero(pv > 0), k + 1)",
      "scope(np.flatnonzero(pv >= 0), k + 1)", ("tests/metrics",)),
    M("fingerprint-order", "scale", "traces/identity.py",
      "self.acc[0] = (self.acc[0] + int(h.sum(dtype=np.uint64))) & _MASK",
      "self.acc[0] = (self.acc[0] * 3 + int(h.sum(dtype=np.uint64))) & _MASK", ("tests/report/test_streaming.py",)),
    M("replay-steps-per-request", "scale", "fit/__init__.py", "for kk in keys[1:3]:\n                new_step",
      "for kk in keys[1:4]:\n                new_step", ("tests/fit/test_replay_arrays.py",)),
    M("synthetic-order", "scale", "traces/synthetic.py", '.sort("_b", "step", "request", "position")',
      '.sort("request", "step", "position")', ("tests/report/test_streaming.py", "tests/fit/test_replay_arrays.py")),
    # held-out scoring
    M("held-out-is-training", "held-out scoring", "fit/__init__.py",
      "        return ~keys.join(trained_keys", "        return keys.join(trained_keys",
      ("tests/fit", "tests/report")),
    # losslessness audit
    # (trimming above instead of below the threshold is an equivalent mutant for the bias: the TV
    # distance of trimming a set equals that of trimming its complement)
    M("audit-q-from-p", "losslessness audit", "report/lossless_audit.py",
      'pl.Series("q_sampled", q_cand.reshape(-1)).cast(pl.Float32)',
      'pl.Series("q_sampled", p_vec.reshape(-1)).cast(pl.Float32)', ("tests/metrics", "tests/report")),
    M("audit-drop-resample", "losslessness audit", "metrics/lossless.py",
      "p_out = trimmed_mass * p + kept * accept + reject_mass * r", "p_out = trimmed_mass * p + kept * accept + reject_mass * p",
      ("tests/metrics", "tests/report")),
    # IRLS options
    M("irls-no-cross-terms", "IRLS", "fit/irls_online.py", "H[0, 1:] = H[1:, 0] = h_wb", "H[0, 1:] = H[1:, 0] = 0.0",
      ("tests/fit",)),
    M("irls-negative-slope-kept", "IRLS", "fit/irls_online.py", "if o.reject_negative_slope and new_w < 0:\n            return",
      "if False:\n            return", ("tests/fit",)),
    M("irls-min-obs-ignored", "IRLS", "fit/irls_online.py", "active = n_k >= max(o.min_obs, 1)", "active = n_k >= 1",
      ("tests/fit",)),
    M("irls-damping-shared", "IRLS", "fit/irls_online.py", "d[1:] *= n_k / (n_k + o.damping)",
      "d[1:] *= n_all / (n_all + o.damping)", ("tests/fit",)),
    M("kernel-no-cross-terms", "IRLS", "fit/irls_kernel.py", "                H[0, q + 1] = h_wb[q]\n",
      "                H[0, q + 1] = 0.0\n", ("tests/fit",)),
    M("kernel-damping-shared", "IRLS", "fit/irls_kernel.py", "d[q + 1] *= n_k[q] / (n_k[q] + damping)",
      "d[q + 1] *= n_all / (n_all + damping)", ("tests/fit",)),
    M("kernel-label-early", "IRLS", "fit/irls_kernel.py",
      "while end < n and (step[end] + label_delay) // cycle_steps <= c:",
      "while end < n and step[end] // cycle_steps <= c:", ("tests/fit",)),
    # offline fitters
    M("sts-inverse", "offline fitters", "fit/calibrators.py", "zz = z / np.exp(log_t)", "zz = z * np.exp(log_t)",
      ("tests/fit",)),
    M("platt-sign", "offline fitters", "fit/calibrators.py", "return expit(self.a_ * feature_values(frame, self.feature) + self.b_)",
      "return expit(self.a_ * feature_values(frame, self.feature) - self.b_)", ("tests/fit",)),
    M("per-position-slope-first", "offline fitters", "fit/logistic.py",
      "z = np.sum(Xf * self.slope_.reshape(len(self.features), -1)[:, pos].T, axis=1)",
      "z = np.sum(Xf * self.slope_.reshape(len(self.features), -1)[:, 0][None, :], axis=1)", ("tests/fit",)),
    # costs and replay
    M("roofline-no-2", "costs and replay", "simulate/costs.py", "compute = 2.0 * m[\"params\"] * t", "compute = m[\"params\"] * t",
      ("tests/simulate",)),
    M("roofline-no-overhead", "costs and replay", "simulate/costs.py", "return (np.maximum(mem, compute) + m[\"overhead_s\"]) * 1e3",
      "return np.maximum(mem, compute) * 1e3", ("tests/simulate",)),
    M("measured-not-monotone", "costs and replay", "simulate/costs.py",
      "ys = np.maximum.accumulate(np.array([self.verify_ms[x] for x in xs]))",
      "ys = np.array([self.verify_ms[x] for x in xs])", ("tests/simulate",)),
    M("draft-no-scaling", "costs and replay", "simulate/costs.py",
      "return float(vals[-1] * batch / batches[-1])", "return float(vals[-1])", ("tests/simulate",)),
    M("parallel-pays-k", "costs and replay", "simulate/costs.py",
      "            return self._draft_row(batch * k, 1)\n", "            return self._draft_row(batch, k)\n",
      ("tests/simulate",)),
    M("interactivity-total", "costs and replay", "simulate/av.py",
      "\"interactivity\": float(np.mean(tok_req[active] / (time_req[active] / 1e3))),",
      "\"interactivity\": total_tok / (total_time / 1e3),", ("tests/simulate",)),
    M("oracle-one-iteration", "costs and replay", "simulate/av.py", "def oracle_choices(groups, trace, costs, iters: int = 50):",
      "def oracle_choices(groups, trace, costs, iters: int = 1):", ("tests/simulate",)),
    # alignment of optional tables
    M("hidden-from-embeddings", "alignment", "collect/engine.py", "hid.append(o.hidden_states[-1][:, -1])",
      "hid.append(o.hidden_states[0][:, -1])", ("tests/collect/test_engine.py", "tests/collect/test_runner.py")),
    M("dists-shifted", "alignment", "collect/engine.py", "position=idx_np[:, 1].astype(np.int16),",
      "position=((idx_np[:, 1] + 1) % K).astype(np.int16),", ("tests/collect/test_engine.py", "tests/collect/test_runner.py")),
    # collection inputs
    M("eos-dropped", "collection inputs", "collect/engine.py", "toks_r = toks_r[: toks_r.index(eos_id) + 1]",
      "toks_r = toks_r[: toks_r.index(eos_id)]", ("tests/collect",)),
    M("truncate-keeps-first", "collection inputs", "collect/encode.py",
      "ids = ids[:keep] + ids[len(ids) - (max_prompt_tokens - keep):]", "ids = ids[:max_prompt_tokens]",
      ("tests/collect/test_engine.py",)),
    M("chat-without-template", "collection inputs", "collect/encode.py",
      "    elif has_template(tokenizer):", "    elif False:", ("tests/collect/test_chat_templates.py",)),
    # Hybrid Verified Decoding
    M("hvd-tau-inclusive", "HVD", "report/hvd.py", "per_pred[n].append(part[f\"_p_{i}\"].to_numpy())",
      "per_pred[n].append(part[f\"_p_{i}\"].to_numpy() + 1e-9)", ("tests/simulate", "tests/fit/test_yield.py")),
    M("global-tree-early", "HVD", "collect/cache_run.py", "while pending and info[pending[0]][4] < s:",
      "while pending and info[pending[0]][4] <= s:", ("tests/collect/test_cache.py",)),
    M("model-accepted-uncapped", "HVD", "collect/cache.py", "return np.minimum(run[:-1], k)", "return run[:-1]",
      ("tests/collect/test_cache.py",)),
    M("hvd-oracle-greedy", "HVD", "simulate/hvd.py", "choice[t] = via_cache < via_model",
      "choice[t] = req.cache_yield[t] > req.model_yield[t]", ("tests/simulate",)),
    # the vLLM plugin (what the main suite checks without an engine; make test-vllm checks the rest)
    M("vllm-label-off-by-one", "vLLM plugin", "vllm_plugin/recorder.py",
      "label = np.where(pos < acc, 1, np.where(pos == acc, 0, -1)).astype(np.int8)",
      "label = np.where(pos <= acc, 1, np.where(pos == acc + 1, 0, -1)).astype(np.int8)", ("tests/vllm_plugin",)),
    M("vllm-accept-ratio-inverted", "vLLM plugin", "vllm_plugin/stats.py",
      "(p_tok / q_tok.clamp_min(1e-30)).clamp(max=1.0)", "(q_tok / p_tok.clamp_min(1e-30)).clamp(max=1.0)",
      ("tests/vllm_plugin",)),
    M("vllm-tv-not-min", "vLLM plugin", "vllm_plugin/stats.py", "expected = torch.minimum(p, q).sum(-1).clamp(0.0, 1.0)",
      "expected = (p * q).sum(-1).clamp(0.0, 1.0)", ("tests/vllm_plugin",)),
    M("vllm-entropy-sign", "vLLM plugin", "collect/sampling.py",
      '"q_entropy": (q * log_q).sum(-1).neg().clamp_min(0)}', '"q_entropy": (q * log_q).sum(-1).clamp_min(0)}',
      ("tests/vllm_plugin", *ENGINE)),
    M("vllm-pairing-unchecked", "vLLM plugin", "vllm_plugin/recorder.py",
      "if n > len(prop.ids) or not np.array_equal(prop.ids[:n], draft_ids[lo:off]):", "if n > len(prop.ids):",
      ("tests/vllm_plugin",)),
    M("vllm-emitted-unclipped", "vLLM plugin", "vllm_plugin/finish.py",
      "return out.with_columns(pl.col(\"_e\").alias(\"emitted\")).drop(\"_budget\", \"_cum\", \"_last\", \"_e\")",
      "return out.drop(\"_budget\", \"_cum\", \"_last\", \"_e\")", ("tests/vllm_plugin",)),
    M("vllm-history-sees-future", "vLLM plugin", "vllm_plugin/cache_rows.py",
      "yields = [common_prefix(du, out[tu:t]) for tu, du in hist]", "yields = [common_prefix(du, out[tu:]) for tu, du in hist]",
      ("tests/vllm_plugin",)),
    M("vllm-request-order-ignored", "vLLM plugin", "vllm_plugin/finish.py",
      "kept = kept.with_columns(pl.col(\"external\").replace_strict(rank, return_dtype=pl.Int64).alias(\"request\"))",
      "kept = kept.with_columns(pl.int_range(pl.len(), dtype=pl.Int64).alias(\"request\"))", ("tests/vllm_plugin",)),
    # reference runs (issue: what a suffix cache / HVD buys on real text)
    M("stand-in-counts-all-hits", "reference runs", "simulate/stand_in.py",
      "runs = np.cumprod(hits, axis=1).sum(axis=1)", "runs = hits.sum(axis=1)", ("tests/collect/test_reference_run.py",)),
    M("stand-in-uncapped", "reference runs", "simulate/stand_in.py",
      "return np.minimum(runs, n - np.arange(n)).astype(np.int64)", "return runs.astype(np.int64)",
      ("tests/collect/test_reference_run.py",)),
    M("chat-answer-left-in-prompt", "reference runs", "collect/workloads.py",
      "return [_answered(name, msgs[:-1], msgs[-1], where, tools, row)]",
      "return [_answered(name, msgs, msgs[-1], where, tools, row)]",
      ("tests/collect/test_reference_workloads.py",)),
    M("eos-after-windows", "reference runs", "collect/encode.py",
      "if prompt.whole_answer and eos is not None:", "if eos is not None:",
      ("tests/collect/test_reference_workloads.py",)),
    M("reference-not-truncated", "reference runs", "collect/encode.py",
      "return Encoded(ids, ref[:max_new_tokens], len(ref) > max_new_tokens)",
      "return Encoded(ids, ref, len(ref) > max_new_tokens)", ("tests/collect/test_reference_run.py",)),
    M("reference-window-shifted", "reference runs", "models/workloads.py",
      '"reference": text[at : at + REFERENCE_CHARS]', '"reference": text[at + 1 : at + REFERENCE_CHARS]',
      ("tests/models/test_workloads_data.py",)),
    M("tau-chosen-on-scored", "reference runs", "simulate/hvd_sweep.py",
      "ms = sum(walk(reqs[i], preds[i] > tau, k, costs, consult=tau < math.inf).ms for i in choose)",
      "ms = sum(walk(reqs[i], preds[i] > tau, k, costs, consult=tau < math.inf).ms for i in score)",
      ("tests/simulate/test_hvd_sweep.py",)),
    M("model-features-see-future", "reference runs", "simulate/hvd_sweep.py",
      "known_at = np.arange(n) + model_yield + 1", "known_at = np.arange(n) + 1", ("tests/simulate/test_hvd_sweep.py",)),
    M("strength-one-power-short", "reference runs", "simulate/hvd_sweep.py",
      "if 1.0 + sum(mid ** i for i in range(1, k + 1)) < tokens:", "if 1.0 + sum(mid ** i for i in range(1, k)) < tokens:",
      ("tests/simulate/test_hvd_sweep.py",)),
    M("profile-batches-ignored", "GPU check", "cli.py", "batches=parse_batches(batches)",
      "batches=parse_batches(None)", ("tests/test_gpu_check.py",)),
    M("random-pair-no-tokenizer", "GPU check", "models/random_pair.py",
      'if f.name.startswith(("tokenizer", "special_tokens")):', 'if f.name.startswith("special_tokens"):',
      ("tests/models/test_random_pair.py",)),
    M("repeat-sees-own-token", "reference runs", "metrics/repetition.py", "        if t - n >= 0:\n",
      "        if t - n + 1 >= 0:\n            seen_out.add(tuple(out[t - n + 1 : t + 1]))\n        if t - n >= 0:\n",
      ("tests/report/test_reference_report.py",)),
    M("held-out-file-trains", "built-in pair", "models/workloads.py",
      "        if is_held_out(rel):\n            raise", "        if False:\n            raise", ("tests/models/test_corpus.py",)),
    M("split-by-wrong-side", "built-in pair", "models/corpus.py", "if is_held_out(rel) != held_out:",
      "if is_held_out(rel) == held_out:", ("tests/models/test_corpus.py",)),
    M("log-last-call-dropped", "built-in pair", "models/workloads.py",
      'for line, name in chunk))\n    return out', 'for line, name in chunk[:-1]))\n    return out',
      ("tests/models/test_corpus.py",)),
    M("stream-docs-unseparated", "built-in pair", "models/train_tiny.py", "[*enc.ids, eos], dtype=np.int64)",
      "enc.ids, dtype=np.int64)", ("tests/models/test_corpus.py",)),
    M("prompt-cut-inside-a-token", "built-in pair", "models/workloads.py", "cut = max(e for e in ends if e <= at)",
      "cut = at", ("tests/models/test_workloads_data.py",)),
    M("fit-out-replaces-any-file", "data loss", "fit/files.py", "        if not is_fit_file(path):\n",
      "        if False:\n", ("tests/test_bad_inputs.py",)),
    M("run-overwrite-any-folder", "data loss", "traces/rundir.py",
      'if not (out / "run.json").is_file():  # --overwrite', "if False:  # --overwrite",
      ("tests/vllm_plugin/test_recorder.py", "tests/interop/test_import.py")),
    M("run-out-overlap-unchecked", "data loss", "traces/rundir.py",
      "if out == src or src in out.parents or out in src.parents:", "if False:",
      ("tests/vllm_plugin/test_recorder.py", "tests/interop/test_import.py")),
    M("toolcall-check-ignores-module", "built-in pair", "report/measure_tiny.py",
      'module="{re.escape(module.group(1))}", ', 'module="[A-Za-z_.]+", ', ("tests/report/test_measure_tiny.py",)),
    # experiment identity and pairing (issue 23)
    M("pairing-exact-only", "regression report", "traces/identity.py", "    if rms <= tolerance:\n",
      "    if rms < 0:\n", ("tests/report/test_compare.py",)),
    M("pairing-ignores-labels", "regression report", "traces/identity.py",
      'STRUCTURE_COLUMNS = ("request", "step", "position", "token", "label")',
      'STRUCTURE_COLUMNS = ("request", "step", "position", "token")', ("tests/report/test_compare.py",)),
    M("fit-names-by-position", "regression report", "fit/files.py",
      'return [f"{lab} [{d}]" if labels.count(lab) > 1 else lab for lab, d in zip(labels, digests, strict=True)]',
      'return [f"{lab} [{i}]" if labels[:i].count(lab) else lab for i, lab in enumerate(labels)]',
      ("tests/report/test_compare.py",)),
    M("held-out-by-run-id-only", "held-out scoring", "fit/__init__.py",
      '            if hit is None and any(isinstance(t.get("data"), dict) for t in trained):', "            if False:",
      ("tests/report/test_evaluate.py",)),
    M("yield-fit-any-pair", "held-out scoring", "fit/__init__.py", "        if pairs and pair not in pairs:",
      "        if False:", ("tests/report/test_evaluate.py",)),
    M("cache-on-a-shard", "silently wrong", "collect/cache_run.py", '    if isinstance(meta.get("shard"), dict):\n',
      "    if False:\n", ("tests/collect/test_shards.py",)),
    M("merge-cached-shards", "silently wrong", "collect/shards.py",
      '        if meta.get("cache") or run.has("cache_drafts"):', "        if False:", ("tests/collect/test_shards.py",)),
    M("json-infinity-kept", "valid JSON", "fileio.py", "    if isinstance(o, float) and not math.isfinite(o):\n",
      "    if isinstance(o, float) and math.isnan(o):\n", ("tests/test_fileio.py",)),
    M("fitted-length-calibration-by-request", "report numbers", "report/sections/acceptance.py",
      '"_c", n_bins=ctx.opts.n_bins, keys=("run", "request", "step"))',
      '"_c", n_bins=ctx.opts.n_bins, keys=("run", "request"))',
      ("tests/report/test_report_numbers.py",)),
    M("fitted-length-calibration-unfiltered", "report numbers", "report/sections/acceptance.py",
      'length_calibration(ctx.drafts.with_columns(f.expr.alias("_c")).filter(pl.col("_c").is_not_null()),',
      'length_calibration(ctx.drafts.with_columns(f.expr.fill_null(0.5).alias("_c")),',
      ("tests/report/test_report_numbers.py",)),
    M("compare-mae-higher-better", "regression report", "metrics/specs.py", 'MetricSpec("mae", "yield", -1,',
      'MetricSpec("mae", "yield", 1,', ("tests/report/test_compare.py",)),
    M("compare-average-precision-lower-better", "regression report", "metrics/specs.py",
      'MetricSpec("average_precision", "yield", 1,', 'MetricSpec("average_precision", "yield", -1,',
      ("tests/report/test_compare.py",)),
    M("sigterm-kills-an-overwrite", "late errors", "collect/runner.py",
      "        with sigterm_unwinds():  # a `kill` unwinds through the cleanup below", "        if True:",
      ("tests/collect/test_runner_safety.py",)),
    M("spool-labels-any-order", "silently wrong", "vllm_plugin/finish.py",
      'bad = seq.filter(pl.col("label").is_not_null() & (pl.col("_before") > 0))',
      'bad = seq.filter(pl.col("label").is_not_null() & (pl.col("_before") > 1))', ("tests/vllm_plugin/test_recorder.py",)),
    M("spool-mixed-sampling", "silently wrong", "vllm_plugin/finish.py", "    if settings.height > 1:\n",
      "    if settings.height > 2:\n", ("tests/vllm_plugin/test_recorder.py",)),
    M("replay-interval-ignored", "regression report", "report/sections/simulation.py",
      'cis = (None, None) if paired else ((p.get("ci95") or {}).get(m), (q.get("ci95") or {}).get(m))',
      "cis = (None, None)", ("tests/report/test_compare.py",)),
    M("fit-seed-unchecked", "tracebacks", "fit/__init__.py",
      "if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:",
      "if isinstance(seed, bool) or not isinstance(seed, int):", ("tests/test_bad_inputs.py",)),
    M("sketch-nan-matches", "regression report", "traces/identity.py",
      "        if not all(_real(x) for x in [*va, *vb]):", "        if False:", ("tests/report/test_compare.py",)),
    M("merge-over-a-shard", "data loss", "collect/shards.py", "        if a == b or b in a.parents or a in b.parents:",
      "        if False:", ("tests/collect/test_shards.py",)),
    M("fit-training-unchecked", "silently wrong", "fit/base.py",
      '        problem = training_problem(d.get("training"))', "        problem = None", ("tests/test_bad_inputs.py",)),
    # fits are estimators: a loaded fit must be the fitted one (coefficients' shapes, its class)
    M("logistic-load-slope-flat", "silently wrong", "fit/logistic.py",
      "self.slope_ = slope.reshape(len(self.features), -1) if self.per_position_slope else np.atleast_1d(slope)",
      "self.slope_ = np.atleast_1d(slope)", ("tests/fit/test_offline.py",)),
    M("online-never-refit-silent", "silently wrong", "fit/irls_online.py",
      "if np.all(est.slope_ == o.init_slope) and np.all(est.intercepts_ == o.init_intercept):", "if False:",
      ("tests/fit/test_offline.py",)),
    M("fit-load-any-class", "silently wrong", "fit/base.py",
      'if cls is not Fitter and d["model"] != cls.name:', "if False:", ("tests/fit/test_offline.py",)),
    # a Ctrl-C polars leaves pending fires again in the cleanup: since every file write goes through
    # fileio.atomic_path, that is where the second cleanup is (synthetic's own one is defensive)
    # interop: foreign traces in, peers' formats out (issue 24)
    M("chain-label-off-by-one", "interop", "interop/base.py", "label = np.where(pos < acc, 1, np.where(pos == acc, 0, -1))",
      "label = np.where(pos <= acc, 1, np.where(pos == acc + 1, 0, -1))", ("tests/interop",)),
    M("import-chain-unchecked", "interop", "interop/__init__.py", "    check_tables(imported, str(path))\n", "",
      ("tests/interop/test_import.py",)),
    M("import-lacks-unchecked", "interop", "traces/io.py",
      'checks.append(pl.col(col).is_not_null().sum().alias(f"lack:{col}"))', "pass",
      ("tests/interop/test_import.py",)),
    M("import-not-read-back", "interop", "interop/base.py", "        open_run(run_dir)  # read back", "        (run_dir)  # read back",
      ("tests/interop/test_import.py",)),
    M("arctic-mixed-tree-allowed", "interop", "interop/arctic_sim.py",
      "            if is_tree.any() and not is_tree.all():", "            if False:", ("tests/interop/test_import.py",)),
    M("arctic-tree-read-as-chains", "interop", "interop/arctic_sim.py",
      "            tree = bool(is_tree.all())", "            tree = False", ("tests/interop/test_import.py",)),
    M("lacking-feature-scored", "interop", "report/evaluate.py",
      "    feats = [f for f in feats if f.name not in not_computed]", "    feats = list(feats)",
      ("tests/interop/test_import.py",)),
    M("half-given-ids-kept", "interop", "interop/base.py", "        if 0 < given < len(requests):", "        if False:",
      ("tests/interop/test_import.py",)),
    M("profile-marginal-unshifted", "interop", "interop/export.py",
      "marginal = [surv[i + 1] for i in range(k)]", "marginal = [surv[i] for i in range(k)]",
      ("tests/interop/test_export.py",)),
    M("latex-unescaped", "interop", "interop/export.py", 'cells = [_tex(r["shown_as"])]', 'cells = [r["shown_as"]]',
      ("tests/interop/test_export.py",)),
    M("suite-label-drops-category", "interop", "collect/workloads.py",
      'label = f"{name}/{category}" if isinstance(category, str) and category else name', "label = name",
      ("tests/collect/test_workload_suites.py",)),
    M("sharegpt-roles-swapped", "interop", "collect/chat.py", '"gpt": "assistant", "assistant": "assistant"',
      '"gpt": "user", "assistant": "assistant"', ("tests/collect/test_workload_suites.py",)),
    M("atomic-cleanup-once", "leftovers", "fileio.py", "            except KeyboardInterrupt:\n                continue\n",
      "            except KeyboardInterrupt:\n                raise\n", ("tests/test_fileio.py",)),
    M("draws-judged-per-metric", "regression report", "report/compare.py",
      "    scale = z / NormalDist().inv_cdf(1 - alpha / 2)\n", "    scale = 1.0\n", ("tests/report/test_compare.py",)),
    # issue 22: one way to do each thing
    M("memory-bound-unapplied", "one way", "vllm_plugin/internals.py",
      "        _reduce_if_large(calls)  # the memory bound", "        pass  # the memory bound",
      ("tests/vllm_plugin/test_stats.py",)),
    M("unknown-fit-option-dropped", "one way", "fit/base.py",
      'unknown = sorted(k for k in given if k not in names and k != "seed")', "unknown = []",
      ("tests/test_bad_inputs.py",)),
    M("upward-import", "one way", "traces/io.py",
      "from svt.fileio import atomic_path, json_text, parse_json, write_text_atomic",
      "from svt.fileio import atomic_path, json_text, parse_json, write_text_atomic\nfrom svt.report import text  # noqa",
      ("tests/test_architecture.py",)),
    M("engine-takes-any-option", "one way", "collect/engines.py", "        if given and not ok:", "        if False:",
      ("tests/collect/test_engines.py",)),
    M("staged-run-swapped-on-error", "one way", "traces/rundir.py",
      "        except BaseException:\n            try:\n                remove_partial(stage)",
      "        except BaseException:\n            swap_in(stage, out)\n            try:\n                remove_partial(stage)",
      ("tests/traces/test_rundir.py",)),
    M("section-left-out", "one way", "report/sections/__init__.py", "Realism(), Groups(),", "Realism(),",
      ("tests/report",)),
    # the bootstrap is row weights through the one-sort engine's accumulators
    M("bootstrap-weights-dropped-in-tie-table", "one way", "metrics/ordered.py",
      "C = np.bincount(cells, weights=wv, minlength=G * k * 2)", "C = np.bincount(cells, minlength=G * k * 2)",
      ("tests/metrics/test_ordered.py",)),
    M("bootstrap-log-loss-unweighted", "one way", "metrics/ordered.py",
      "self.ll += per_pos(w * ll)", "self.ll += per_pos(ll)", ("tests/metrics/test_ordered.py",)),
    M("bootstrap-percentiles-one-sided", "one way", "metrics/ordered.py",
      "lo, hi = (1 - level) / 2 * 100, (1 + level) / 2 * 100", "lo, hi = (1 - level) * 100, level * 100",
      ("tests/metrics/test_ordered.py",)),
    M("run-batch-unseen-kept", "one way", "collect/engine.py",
      "    rows.has_unseen = all_acc.long()", "    rows.has_unseen = torch.zeros_like(all_acc).long()", ENGINE),

    # issue 32: real traffic as it is (chat templates, agent logs, rows, paths, positions)
    M("chat-ids-from-keys", "real traffic", "collect/encode.py",
      'if hasattr(out, "keys") and "input_ids" in out.keys():', "if False:", ('tests/collect/test_chat_templates.py',)),
    M("reference-tokenized-with-prompt", "real traffic", "collect/encode.py",
      "ref = _tokens(tokenizer, full[len(text):])", "ref = _tokens(tokenizer, full)[len(ids):]", ('tests/collect/test_chat_templates.py',)),
    M("template-prefix-unchecked", "real traffic", "collect/encode.py", "if not full.startswith(text):",
      "if False:", ('tests/collect/test_chat_templates.py',)),
    M("template-error-uncaught", "real traffic", "collect/encode.py",
      "    except Exception as exc:  # jinja's TemplateError", "    except ValueError as exc:  # jinja's TemplateError",
      ('tests/collect/test_chat_templates.py',)),
    M("head-not-kept", "real traffic", "collect/encode.py",
      "ids = ids[:keep] + ids[len(ids) - (max_prompt_tokens - keep):]", "ids = ids[-max_prompt_tokens:]", ('tests/collect/test_chat_templates.py',)),
    M("tool-calls-dropped", "real traffic", "collect/chat.py",
      'calls = _tool_calls(m, where) if role == "assistant" else ()', "calls = ()", ('tests/collect/test_chat_templates.py',)),
    M("roles-case-sensitive", "real traffic", "collect/chat.py",
      "if not isinstance(role, str) or role.strip().lower() not in ROLES:",
      "if not isinstance(role, str) or role not in ROLES:", ('tests/collect/test_chat_templates.py',)),
    M("plain-drops-tool-calls", "real traffic", "collect/chat.py",
      "+ [plain_call(c) for c in m.tool_calls])", "+ [])", ('tests/collect/test_chat_templates.py',)),
    M("turn-answer-in-its-prompt", "real traffic", "collect/workloads.py",
      'out = [_answered(name, msgs[:i], m, f"{where} turn {i + 1}", tools, row)',
      'out = [_answered(name, msgs[:i + 1], m, f"{where} turn {i + 1}", tools, row)', ('tests/collect/test_chat_templates.py',)),
    M("rows-repeat-silently", "real traffic", "collect/workloads.py", "if n > len(order) and not repeat:", "if False:",
      ("tests/models/test_workloads_data.py", "tests/collect/test_real_traffic.py")),
    M("repeats-uncounted", "real traffic", "collect/workloads.py", "repeated += p.where in seen", "repeated += 0",
      ('tests/collect/test_real_traffic.py',)),
    M("missing-reference-not-skipped", "real traffic", "collect/workloads.py",
      "read = [[p for p in w if has_reference(p)] for w in read]", "read = read", ('tests/collect/test_real_traffic.py',)),
    M("path-from-cwd", "real traffic", "config.py", "    return Path(config_path).resolve().parent / p\n",
      "    return p\n", ('tests/collect/test_real_traffic.py',)),
    M("cli-path-from-config", "real traffic", "config.py",
      "out[\"workloads\"] = [_absolute(w) if isinstance(w, str) and _is_path(w) else",
      "out[\"workloads\"] = [w if isinstance(w, str) and _is_path(w) else", ('tests/collect/test_real_traffic.py',)),
    M("reference-positions-unchecked", "real traffic", "collect/reference_run.py",
      "check_positions(prompts, [len(x) + len(r) for x, r in zip(ids, refs, strict=True)],",
      "check_positions(prompts, [len(x) for x, r in zip(ids, refs, strict=True)],", ('tests/collect/test_real_traffic.py',)),
    M("jsonl-splitlines", "real traffic", "fileio.py", 'for lineno, line in enumerate(text.split("\\n"), 1):',
      "for lineno, line in enumerate(text.splitlines(), 1):", ('tests/collect/test_chat_templates.py',)),
    M("evaluate-overwrites-silently", "real traffic", "report/render.py",
      'if (out / "report.json").exists() and not overwrite:', "if False:", ("tests/report/test_evaluate.py",)),
    M("output-made-before-rendering", "real traffic", "collect/plan.py", "    prompts = workloads.prompts\n",
      "    out.mkdir(parents=True, exist_ok=True)\n    prompts = workloads.prompts\n",
      ("tests/collect/test_real_traffic.py",)),
    M("null-role-passes", "real traffic", "collect/chat.py",
      "if not isinstance(role, str) or role.strip().lower() not in ROLES:",
      "if isinstance(role, str) and role.strip().lower() not in ROLES:", ("tests/collect/test_chat_templates.py",)),
    M("target-positions-unchecked", "real traffic", "collect/plan.py",
      "check_positions(prompts, [len(x) + cfg.max_new_tokens + cfg.k + 1 for x in ids]",
      "check_positions(prompts, [len(x) for x in ids]", ("tests/collect/test_real_traffic.py",)),
    M("turns-not-an-experiment", "real traffic", "traces/identity.py",
      'extra = {**({"turns": turns} if any(t != "last" for t in turns.values()) else {}),',
      'extra = {**({}),', ("tests/report/test_compare.py",)),
    M("template-head-needs-a-system-turn", "real traffic", "collect/encode.py", "    if first is None:\n        return None\n",
      "    if first is None or first == 0:\n        return None\n", ("tests/collect/test_chat_templates.py",)),
    M("tool-calls-unrendered-accepted", "real traffic", "collect/encode.py", "            if c.name not in text:",
      "            if False:", ("tests/collect/test_chat_templates.py",)),
    M("legacy-call-string-ignored", "real traffic", "collect/chat.py", "        if not isinstance(legacy, dict):",
      "        if False:", ("tests/collect/test_chat_templates.py",)),
    # issue 33: the induction gate
    M("gate-repeat-shifted", "induction gate", "models/induction.py",
      "rep_pred = torch.arange(length + 1, 2 * length, device=device)",
      "rep_pred = torch.arange(length, 2 * length - 1, device=device)", ("tests/models/test_induction.py",)),
    M("gate-head-key-shifted", "induction gate", "models/induction.py", "        k = q - length + 1\n",
      "        k = q - length\n", ("tests/models/test_induction.py",)),
    M("phase-copy-not-written", "induction gate", "models/induction_phase.py",
      "        x[b, at + span + gap : at + 2 * span + gap] = src\n", "", ("tests/models/test_induction.py",)),
    # issue 33: the staged recipe
    M("phase-max-span-ignored", "pair recipe", "models/induction_phase.py",
      "min(n // 2, cfg.max_span or n) + 1", "n // 2 + 1", ("tests/models/test_induction.py",)),
    M("recipe-lr-never-decays", "pair recipe", "models/induction_phase.py",
      "return cfg.lr * (cfg.final_lr_share + (1 - cfg.final_lr_share) * 0.5 * (1 + math.cos(math.pi * frac)))",
      "return cfg.lr", ("tests/models/test_recipe.py",)),
    M("recipe-jump-never-stops", "pair recipe", "models/induction_phase.py",
      'if jumped is not None and tokens >= jumped["tokens"] + cfg.after_jump_tokens:',
      "if False:", ("tests/models/test_recipe.py",)),
    M("recipe-stage-retrained", "pair recipe", "models/recipe.py", "        if done.is_file():",
      "        if False:", ("tests/models/test_recipe.py",)),
    M("recipe-resume-ignores-checkpoint", "pair recipe", "models/induction_phase.py",
      "    if ckpt.is_file():", "    if False:", ("tests/models/test_recipe.py",)),
    M("distil-unweighted", "pair recipe", "models/induction_phase.py",
      "        weight = target_probs.amax(-1) ** confidence_weight",
      "        weight = torch.ones_like(target_probs[..., 0])", ("tests/models/test_recipe.py",)),
    # issue 34: fit files are checked on load against each fitter's fields
    M("fit-fields-unchecked", "fit files", "fit/base.py", '            FITTERS[d["model"]].check_fields(d)\n',
      "            pass\n", ("tests/fit/test_fit_files.py",)),
    M("fit-fitter-without-field-checks", "fit files", "fit/base.py",
      "    if cls.check_fields.__func__ is Fitter.check_fields.__func__:", "    if False:", ("tests/fit/test_fit_files.py",)),
    M("fit-field-nan-passes", "fit files", "fit/files.py", "return type(v) in (float, int) and math.isfinite(v)",
      "return type(v) in (float, int)", ("tests/fit/test_fit_files.py",)),
    M("fit-field-zero-std-passes", "fit files", "fit/files.py", "        if (a <= 0).any():", "        if (a < 0).any():", ("tests/fit/test_fit_files.py",)),
    M("fit-field-longer-list-passes", "fit files", "fit/files.py", "if (not v) if n is None else len(v) != n:",
      "if (not v) if n is None else len(v) < n:", ("tests/fit/test_fit_files.py",)),
    M("fit-field-flag-any-type", "fit files", "fit/files.py", "    if not isinstance(v, bool):\n",
      "    if not isinstance(v, bool | str):\n", ("tests/fit/test_fit_files.py",)),
    M("fit-field-missing-nested-passes", "fit files", "fit/files.py", "    if key not in d:\n",
      "    if key not in d and not at:\n", ("tests/fit/test_fit_files.py",)),
    M("fit-config-unknown-keys-pass", "fit files", "fit/files.py", "    unknown = sorted(set(v) - set(fields))",
      "    unknown = []", ("tests/fit/test_fit_files.py",)),
    M("fit-config-types-unchecked", "fit files", "fit/files.py",
      "        if f.name in v or f.default is dataclasses.MISSING:", "        if f.default is dataclasses.MISSING:", ("tests/fit/test_fit_files.py",)),
    M("logistic-slope-any-length", "fit files", "fit/logistic.py",
      '((m, k), f"{m} lists of {k} numbers") if m > 1 else ((k,), f"a list of {k} numbers")',
      '((m, k), f"{m} lists of {k} numbers") if m > 1 else ((None,), f"a list of {k} numbers")', ("tests/fit/test_fit_files.py",)),
    M("logistic-flag-from-top-level", "fit files", "fit/logistic.py",
      '        pp = flag(opts, "per_position_slope", at="options")', '        pp = bool(opts.get("per_position_slope"))', ("tests/fit/test_fit_files.py",)),
    M("irls-slope-shape-unchecked", "fit files", "fit/irls_online.py",
      '        finite(d, "slope", (k,) if pp else (), why=', '        finite(d, "slope", (None,) if pp else (), why=', ("tests/fit/test_fit_files.py",)),
    M("irls-path-cycles-unordered", "fit files", "fit/irls_online.py", "        if cycle <= last:", "        if cycle < last:", ("tests/fit/test_fit_files.py",)),
    M("irls-path-intercepts-unchecked", "fit files", "fit/irls_online.py",
      '        finite(e, "intercepts", (k,), at=at, why="one per position")', '        need(e, "intercepts", at)', ("tests/fit/test_fit_files.py",)),
    M("irls-options-ranges-unchecked", "fit files", "fit/irls_online.py",
      "            o = OnlineOptions(**opts).validate()", "            o = OnlineOptions(**opts)", ("tests/fit/test_fit_files.py",)),
    M("sts-zero-temperature-passes", "fit files", "fit/calibrators.py",
      't = finite(d, "temperatures", (None,), positive=True,', 't = finite(d, "temperatures", (None,),', ("tests/fit/test_fit_files.py",)),
    M("sts-derived-slope-unchecked", "fit files", "fit/calibrators.py", "1 / t, rtol=1e-12, atol=0)",
      "1 / t, rtol=1e-12, atol=np.inf)", ("tests/fit/test_fit_files.py",)),
    M("platt-one-intercept-unchecked", "fit files", "fit/calibrators.py", "        if np.any(b != b[0]):",
      "        if np.any(b[:1] != b[0]):", ("tests/fit/test_fit_files.py",)),
    M("isotonic-x-order-unchecked", "fit files", "fit/calibrators.py",
      '        for key, a in (("x_thresholds", x), ("y_thresholds", y)):', '        for key, a in (("y_thresholds", y),):', ("tests/fit/test_fit_files.py",)),
    M("yield-zero-std-passes", "fit files", "fit/yield_models.py",
      '        finite(d, "std", (n,), positive=True, why=', '        finite(d, "std", (n,), why=', ("tests/fit/test_fit_files.py",)),
    M("yield-coef-any-length", "fit files", "fit/yield_models.py", '        finite(d, "coef", (n,), why=',
      '        finite(d, "coef", (None,), why=', ("tests/fit/test_fit_files.py",)),
    M("yield-mlp-width-unchecked", "fit files", "fit/yield_models.py",
      '        if integer(cfg, "n_features", "config", minimum=1) != n:', '        if integer(cfg, "n_features", "config", minimum=1) < 1:', ("tests/fit/test_fit_files.py",)),
    M("head-zero-width-passes", "fit files", "fit/head.py", '        integer(cfg, "hidden_size", "config", minimum=1)',
      '        integer(cfg, "hidden_size", "config")', ("tests/fit/test_fit_files.py",)),
    # issue 34: one writer per output, user features checked on every row
    M("lock-not-taken", "reliability 3", "fileio.py", "            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)",
      "            pass", ("tests/test_output_lock.py",)),
    M("lock-inside-run-unchecked", "reliability 3", "fileio.py", "    if host is not None:  # a run's folders",
      "    if False:  # a run's folders", ("tests/test_output_lock.py",)),
    M("atomic-tmp-shared", "reliability 3", "fileio.py", 'f".{path.name}.{os.getpid()}.tmp"', 'f".{path.name}.tmp"',
      ("tests/test_output_lock.py",)),
    M("collect-unlocked", "reliability 3", "collect/runner.py", "    with output_lock(out):  # one writer per output",
      "    if True:  # one writer per output", ("tests/test_output_lock.py",)),
    M("feature-label-allowed", "reliability 3", "features/__init__.py", '        if "label" in reads:',
      "        if False:", ("tests/features/test_feature_checks.py",)),
    M("feature-lossless-target-allowed", "reliability 3", "features/__init__.py",
      "        if self.lossless and reads & TARGET_COLUMNS:", "        if False:",
      ("tests/features/test_feature_checks.py",)),
    M("feature-dtype-unchecked", "reliability 3", "features/__init__.py",
      "    if not (col.dtype.is_numeric() or col.dtype in (pl.Boolean, pl.Null)):", "    if False:",
      ("tests/features/test_feature_checks.py",)),
    M("profile-falls-unflagged", "reliability 3", "collect/profile.py",
      "            if times[c] < times[b] * (1 - slack):", "            if False:", ("tests/collect/test_profile.py",)),
    M("profile-load-unchecked", "reliability 3", "collect/profile.py", "    if others > before[\"cores\"] / 2:",
      "    if False:", ("tests/collect/test_profile.py",)),
    M("profile-spread-unchecked", "reliability 3", "collect/profile.py", "        if w > SPREAD_WARN:",
      "        if False:", ("tests/collect/test_profile.py",)),
    M("costs-warnings-dropped-on-read", "reliability 3", "simulate/costs.py",
      "draft, verify, measurement=measurement)", "draft, verify)", ("tests/collect/test_profile.py",)),
    M("report-cost-warnings-silent", "reliability 3", "report/text.py", "    w = costs.get(\"warnings\") or []",
      "    w = []", ("tests/collect/test_profile.py",)),
    M("threads-ignore-cores", "reliability 3", "devices.py", "    n = threads or available_cores()",
      "    n = threads or 1", ("tests/collect/test_profile.py",)),
    M("compare-imports-refused", "reliability 3", "report/compare.py",
      "    if not rep[\"features\"] and not any(rep.get(k) for k in other):", "    if not rep[\"features\"]:",
      ("tests/interop/test_import.py",)),
    M("import-times-unchecked", "reliability 3", "interop/base.py", '    for col in ("draft_ms", "verify_ms"):',
      "    for col in ():", ("tests/interop/test_import.py",)),
    M("import-split-request-kept", "reliability 3", "interop/table.py", '        if split.height:\n            r = split.row(0',
      '        if False:\n            r = split.row(0', ("tests/interop/test_import.py",)),
    M("import-accepted-at-p0", "reliability 3", "interop/base.py",
      '        x = d.filter((pl.col("label") == 1) & (pl.col("accept_prob") == 0))',
      '        x = d.filter((pl.col("label") == 1) & (pl.col("accept_prob") < 0))', ("tests/interop/test_import.py",)),
    M("symlinked-out-replaced", "reliability 3", "fileio.py", "    if out.is_symlink():  # a swap",
      "    if False:  # a swap", ("tests/test_output_lock.py",)),
    M("vllm-steps-huge-drafts", "reliability 3", "interop/vllm_steps.py", "bound=MAX_DRAFTED)", "bound=COUNT_MAX)",
      ("tests/interop/test_import.py",)),
    M("arctic-truncated-row-kept", "reliability 3", "interop/arctic_sim.py",
      "odd = f.filter(flag.is_null() | ~flag.is_in(", "odd = f.filter(~flag.is_in(", ("tests/interop/test_import.py",)),
    M("export-replaces-report", "reliability 3", "interop/export.py", "    if what is not None:  # --overwrite",
      "    if False:  # --overwrite", ("tests/interop/test_export.py",)),
    M("feature-failure-uncaught-in-scoring", "reliability 3", "report/scoring.py",
      '            cache["_scores"] = {f.name: feature_values(f, labelled) for f in whole}', "            raise",
      ("tests/features/test_feature_checks.py",)),
    M("import-source-ids-dropped", "reliability 3", "interop/vllm_steps.py",
      "request_names=names, svt_source=origin.result())", "request_names=names)", ("tests/fit/test_held_out_follows_the_data.py",)),
    M("export-source-ids-dropped", "reliability 3", "interop/export.py",
      '**({"svt_run_id": run_id, "svt_request": row["request"]} if isinstance(run_id, str) else {})}', "}",
      ("tests/fit/test_held_out_follows_the_data.py",)),
    M("source-map-ignored", "reliability 3", "fit/__init__.py", "    keys = _source_requests(keys, seen, paths)\n",
      "", ("tests/fit/test_held_out_follows_the_data.py",)),
    M("signatures-not-checked", "reliability 3", "fit/__init__.py",
      "        return ~_repeated_requests(fit, drafts, paths, notes)", "        return np.ones(drafts.height, dtype=bool)",
      ("tests/fit/test_held_out_follows_the_data.py",)),
    M("signature-ignores-order", "reliability 3", "traces/identity.py",
      "h = _mix64(_mix64(code + np.uint64(0x9E3779B97F4A7C15)) ^ _mix64(j ^ np.uint64(0xC2B2AE3D27D4EB4F)))",
      "h = _mix64(_mix64(code + np.uint64(0x9E3779B97F4A7C15)))", ("tests/fit/test_held_out_follows_the_data.py",)),
    M("repeated-requests-kept", "reliability 3", "fit/__init__.py",
      '    rep = found.filter("_rep").select(', '    rep = found.filter(False).select(', ("tests/fit/test_held_out_follows_the_data.py",)),
    M("source-mixed-accepted", "reliability 3", "interop/provenance.py",
      "            if self.requests:\n                raise fail(", "            if False:\n                raise fail(", ("tests/fit/test_held_out_follows_the_data.py",)),
    M("scorer-nan-unscored", "reliability 3", "report/scoring.py", "        if bad.any():  # a prediction",
      "        if False:  # a prediction", ("tests/report/test_scoring_checks.py",)),
    M("export-no-drafts-written", "reliability 3", "interop/export.py", "    if d is None or d.height == 0:\n",
      "    if d is None:\n", ("tests/collect/test_reference_run.py",)),
    M("export-not-read-back", "reliability 3", "interop/export.py", "            _reads_back(kind, source, tmp)\n", "",
      ("tests/interop/test_export.py",)),
    M("sketch-threshold-scaled", "reliability 3", "traces/identity.py", "    if rms <= tolerance:\n",
      "    if rms <= 33 * tolerance:\n", ("tests/report/test_compare.py",)),
    M("sketch-rms-no-sqrt", "reliability 3", "traces/identity.py", "worst = max(worst, math.sqrt(msd / max(n, 1)))",
      "worst = max(worst, msd / max(n, 1))", ("tests/report/test_compare.py",)),
    M("scope-tolerance-after-global", "reliability 3", "report/judge.py",
      'for key, basis in ((f"{scope}.{metric}", "tolerance"), (metric, "tolerance")):',
      'for key, basis in ((metric, "tolerance"), (f"{scope}.{metric}", "tolerance")):', ("tests/report/test_compare.py",)),
    M("scope-tolerance-ignored", "reliability 3", "report/judge.py",
      'for key, basis in ((f"{scope}.{metric}", "tolerance"), (metric, "tolerance")):',
      'for key, basis in ((metric, "tolerance"),):', ("tests/report/test_compare.py",)),
    M("map-tau-chosen-on-scored", "reliability 3", "simulate/hvd_sweep.py",
      "            res = policy_results(sub, preds, k, costs, choose, score)",
      "            res = policy_results(sub, preds, k, costs, score, score)", ("tests/simulate/test_hvd_sweep.py",)),
    M("two-sided-base-tau-on-scored", "reliability 3", "simulate/hvd_sweep.py",
      "        base = summarise(policy_results(reqs, preds, k, costs, choose, score))",
      "        base = summarise(policy_results(reqs, preds, k, costs, score, score))", ("tests/simulate/test_hvd_sweep.py",)),
    M("two-sided-margin-on-scored", "reliability 3", "simulate/hvd_sweep.py",
      "            ms = sum(walk(reqs[i], use_cache(i, m), k, costs, consult=True).ms for i in choose)",
      "            ms = sum(walk(reqs[i], use_cache(i, m), k, costs, consult=True).ms for i in score)", ("tests/simulate/test_hvd_sweep.py",)),
    M("two-sided-verify-charge-k", "reliability 3", "simulate/hvd_sweep.py",
      "cache_rate = (yc_hat + 1) / (costs.verify(1 + r.draft_len.astype(np.int64)) + r.lookup_ms)",
      "cache_rate = (yc_hat + 1) / (costs.verify(np.full(r.draft_len.size, 1 + k)) + r.lookup_ms)", ("tests/simulate/test_hvd_sweep.py",)),
    M("two-sided-model-verify-one", "reliability 3", "simulate/hvd_sweep.py",
      "model_ms = costs.draft(1, k) + float(costs.verify(1 + k))", "model_ms = costs.draft(1, k) + float(costs.verify(1))",
      ("tests/simulate/test_hvd_sweep.py",)),
    M("walk-cache-verify-k", "reliability 3", "simulate/hvd.py",
      "            res.ms += float(costs.verify(1 + int(req.draft_len[t])))",
      "            res.ms += float(costs.verify(1 + k))", ("tests/simulate/test_hvd_sweep.py",)),
    M("oracle-cache-verify-k", "reliability 3", "simulate/hvd.py",
      "    cache_ms = costs.verify(1 + req.draft_len.astype(np.int64)) + req.lookup_ms",
      "    cache_ms = costs.verify(np.full(n, 1 + k)) + req.lookup_ms", ("tests/simulate/test_hvd_sweep.py",)),
    M("source-map-unchecked", "reliability 3", "fit/__init__.py",
      "        _check_source_map(fit, drafts, keys, ids, seen, paths)", "        pass", ("tests/fit/test_held_out_follows_the_data.py",)),
    M("source-map-twice-allowed", "reliability 3", "traces/identity.py", "    if len(set(reqs)) != len(reqs):",
      "    if False:", ("tests/fit/test_held_out_follows_the_data.py",)),
    M("source-map-length-unchecked", "reliability 3", "fit/__init__.py",
      "if src is not None and isinstance(n, int) and len(src[1]) != n:", "if False:", ("tests/fit/test_held_out_follows_the_data.py",)),
    M("signature-uninformative-signed", "reliability 3", "traces/identity.py",
      ' & (pl.col("_n") - pl.col("_mode") >= MIN_VARIED_STEPS)', "", ("tests/fit/test_held_out_follows_the_data.py",)),
    M("export-labels-unchecked", "reliability 3", "interop/export.py", "    if tuple(int(x) for x in d) != got:",
      "    if False:", ("tests/fit/test_held_out_follows_the_data.py",)),
    M("profile-single-forward-samples", "reliability 3", "collect/profile.py",
      "                    inner = min(MAX_INNER, max(1, math.ceil(SAMPLE_MS / max(t * 1e3, 1e-3))))",
      "                    inner = 1", ("tests/collect/test_profile.py",)),
    M("coverage-always-all", "real traffic", "report/hvd.py",
      'coverage = (f"all {total} requests" if len(keys) == total or not fits else',
      'coverage = (f"all {total} requests" if True else', ("tests/report/test_reference_report.py",)),
    M("reference-cache-all-requests", "real traffic", "report/reference.py",
      'block["reference_cache"] = _cache_stats(reference_run, shared)',
      'block["reference_cache"] = _cache_stats(reference_run)', ("tests/report/test_reference_report.py",)),
    M("realism-dash-columns", "real traffic", "report/sections/realism.py", 'if block["kind"] == "reference":',
      "if False:", ("tests/report/test_reference_report.py",)),
    M("map-interval-90", "real traffic", "simulate/hvd_sweep.py",
      "lo, hi = np.nanpercentile(gains, [2.5, 97.5])", "lo, hi = np.nanpercentile(gains, [5, 95])",
      ("tests/simulate/test_hvd_sweep.py",)),
    M("map-few-unhatched", "real traffic", "plots/hvd.py", 'if r.get("requests", FEW) < FEW:',
      'if r.get("requests", FEW) < 3:', ("tests/report/test_reference_report.py",)),
    M("map-spans-zero-unmarked", "real traffic", "plots/hvd.py",
      'text = f"({_pct(v)}%)" if zero else f"{_pct(v)}%"', 'text = f"{_pct(v)}%"',
      ("tests/report/test_reference_report.py",)),
    M("map-vmax-ignored", "real traffic", "plots/hvd.py",
      "lim = float(vmax) if vmax is not None else max(5.0, float(np.nanmax(np.abs(grid))))",
      "lim = max(5.0, float(np.nanmax(np.abs(grid))))", ("tests/report/test_reference_report.py",)),
]


def _copy_tree(dst: Path) -> None:
    shutil.copytree(ROOT / "toolkit", dst / "toolkit", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    shutil.copytree(ROOT / "tests", dst / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("data", "configs", "examples", "notebooks", "pyproject.toml", "scripts", "benchmarks"):
        (dst / name).symlink_to(ROOT / name)


def _run(dst: Path, tests: tuple[str, ...], full: bool, timeout: int) -> tuple[bool, float]:
    env = {**os.environ, "PYTHONPATH": str(dst / "toolkit"), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    args = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-o", "addopts="]
    args += ["tests"] if full else list(tests)
    t0 = time.time()
    try:
        r = subprocess.run(args, cwd=dst, env=env, capture_output=True, text=True, timeout=timeout)
        _run.last_output = r.stdout[-3000:] + r.stderr[-1000:]
        return r.returncode == 0, time.time() - t0
    except subprocess.TimeoutExpired:
        return False, time.time() - t0  # a hang counts as caught (the suite would not pass)


def stale(mutants) -> list[str]:
    """Mutants that no longer apply: a snippet not found exactly once, a test file that is gone."""
    bad = []
    for m in mutants:
        path = ROOT / "toolkit" / "svt" / m.file
        n = path.read_text().count(m.old) if path.is_file() else 0
        if n != 1:
            bad.append(f"{m.id}: snippet found {n} times in {m.file}")
        bad += [f"{m.id}: no test file {t}" for t in m.tests if not (ROOT / t.split("::")[0]).exists()]
    return bad


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--only", nargs="*", help="mutant ids to run")
    ap.add_argument("--full", action="store_true", help="run the whole suite for every mutant")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--check", action="store_true",
                    help="only check that every mutant's snippet occurs once and its tests exist (seconds)")
    ap.add_argument("--timeout", type=int, default=900)
    ap.add_argument("--out", type=Path, default=ROOT / "reports" / "mutate.json")
    args = ap.parse_args(argv)
    chosen = [m for m in MUTANTS if not args.only or m.id in args.only]
    if args.list:
        for m in chosen:
            print(f"{m.id:28s} {m.area:20s} {m.file}")
        return 0
    if args.check:
        bad = stale(chosen)
        print("\n".join(bad) or f"{len(chosen)} mutants apply")
        return 1 if bad else 0
    results = []
    with tempfile.TemporaryDirectory(prefix="svt-mutate-") as tmp:
        dst = Path(tmp)
        _copy_tree(dst)
        probe = subprocess.run([sys.executable, "-c", "import svt; print(svt.__file__)"], cwd=dst, text=True,
                               capture_output=True, env={**os.environ, "PYTHONPATH": str(dst / "toolkit")})
        if not probe.stdout.strip().startswith(str(dst)):
            print(f"the copy is not the package imported: {probe.stdout} {probe.stderr}")
            return 2
        areas = sorted({t for m in chosen for t in m.tests})
        ok, secs = _run(dst, tuple(areas), args.full, args.timeout)
        print(f"unmutated copy: {'passes' if ok else 'FAILS'} ({secs:.0f} s)")
        if not ok:
            print(getattr(_run, "last_output", ""))
            return 2
        for m in chosen:
            path = dst / "toolkit" / "svt" / m.file
            src = path.read_text()
            if src.count(m.old) != 1:
                print(f"{m.id}: snippet found {src.count(m.old)} times in {m.file}; fix the mutant list")
                return 2
            path.write_text(src.replace(m.old, m.new))
            try:
                passed, secs = _run(dst, m.tests, args.full, args.timeout)
            finally:
                path.write_text(src)
            results.append({"id": m.id, "area": m.area, "file": m.file, "killed": not passed, "seconds": round(secs, 1)})
            print(f"{m.id:28s} {m.area:20s} {'killed' if not passed else 'SURVIVED'}  ({secs:.0f} s)", flush=True)
    killed = sum(r["killed"] for r in results)
    print(f"\n{killed}/{len(results)} mutants killed")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"killed": killed, "total": len(results), "mutants": results}, indent=2) + "\n")
    return 0 if killed == len(results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
