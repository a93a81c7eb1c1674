"""The ``cache_drafts`` table of a vLLM run with the `suffix` method, from the engine's own proposals.

One row per request and engine step where vLLM's SuffixDecoding proposer ran for the request (a row
with ``draft_len`` 0 where it proposed nothing), not one per decode position as svt's own replay
(`svt cache`) writes: the engine only proposes where its steps land. Every feature at a row uses
only what was known when the engine proposed: the draft and its match statistics as arctic-inference
returned them, and history features over the request's earlier rows, compared only with tokens
generated before the row's position. The labels: ``oracle_accepted``, the common prefix of the
draft with the request's real continuation (what a greedy verification accepts), and
``model_accepted``, the model drafter's accepted length from the same position with K drafts,
teacher-forced (the draft model must be named: the engine ran no model drafter).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from svt.collect.cache import (
    teacher_forced_accepted,
)
from svt.errors import DataError, ModelLoadError
from svt.features.char_classes import CHAR_CLASSES, char_class_shares, char_class_table
from svt.metrics.repetition import common_prefix

HISTORY = 8  # earlier rows the history features look back over (svt's own default)


def cache_rows(cache: pl.DataFrame, reqs: pl.DataFrame, k: int, target: str | None, draft: str | Path | None,
               where) -> pl.DataFrame:
    """``cache``: the spool's cache rows joined with svt's ``request`` and ``workload``; ``reqs``:
    the finished requests (request, prompt_ids, output_ids)."""
    if draft is None:
        raise DataError(f"{where}: the engine's suffix drafts need a draft model for `model_accepted` (the "
                        "model drafter's accepted length the HVD replay compares with): pass --draft PATH.")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if target is None or not Path(target).is_dir():
        raise ModelLoadError(f"{where}: the engine's target {target!r} is not a local folder here; its tokenizer "
                             "gives the drafts' character classes.")
    try:
        tok = AutoTokenizer.from_pretrained(target, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(str(draft), local_files_only=True, dtype="float32")
    except Exception as exc:  # noqa: BLE001 - transformers raises many kinds
        raise ModelLoadError(f"Could not load the tokenizer of {target!r} or the draft {str(draft)!r}: {exc}") from None
    model.eval()
    draft_dir = Path(draft)
    if (draft_dir / "tokenizer.json").is_file() or (draft_dir / "tokenizer_config.json").is_file():
        if AutoTokenizer.from_pretrained(str(draft_dir), local_files_only=True).get_vocab() != tok.get_vocab():
            raise ModelLoadError(f"The draft {str(draft)!r} does not share the target's tokenizer ({target!r}); its "
                                 "accepted lengths on the target's tokens would mean nothing.")
    outputs = dict(zip(reqs["request"].to_list(), reqs["output_ids"].to_list(), strict=True))
    prompts = dict(zip(reqs["request"].to_list(), reqs["prompt_ids"].to_list(), strict=True))
    top = max([len(tok)] + [max(ids, default=0) + 1 for ids in cache["draft_ids"].to_list()])
    classes = char_class_table(tok, top)
    order = sorted(outputs)
    model_acc = dict(zip(order, teacher_forced_accepted(model, [(prompts[r], outputs[r]) for r in order], k),
                         strict=True))
    rows = []
    for (r,), part in cache.sort("request", "decode_pos").group_by("request", maintain_order=True):
        out = np.asarray(outputs[r], dtype=np.int64)
        ctx_all = np.asarray(prompts[r] + outputs[r], dtype=np.int64)
        earlier: list[tuple[int, np.ndarray]] = []
        prev = (0, 0)
        for row in part.iter_rows(named=True):
            t = row["decode_pos"]
            if t >= out.size:  # proposed at the request's last step, past its final token: never used
                continue
            if not 0 <= t < out.size or (earlier and t <= earlier[-1][0]):
                raise DataError(f"{where}: request {r}: suffix proposal at decode position {t} (output of {out.size} "
                                "tokens, after position "
                                f"{earlier[-1][0] if earlier else None}); the spool is damaged.")
            if row["context_len"] != len(prompts[r]) + t:
                raise DataError(f"{where}: request {r} position {t}: context of {row['context_len']} tokens, but "
                                f"prompt + output so far is {len(prompts[r]) + t}; the spool is damaged.")
            d = np.asarray(row["draft_ids"], dtype=np.int64)
            probs = np.asarray(row["probs"], dtype=np.float64)
            hist = earlier[-HISTORY:]
            yields = [common_prefix(du, out[tu:t]) for tu, du in hist]
            m = row["match_len"]
            ctx = ctx_all[: len(prompts[r]) + t]
            rec = {"request": r, "workload": row["workload"], "decode_pos": t, "draft_ids": d.tolist(),
                   "draft_len": d.size, "match_len": m, "score": row["score"],
                   "prob_mean": float(probs.mean()) if probs.size else 0.0,
                   "prob_min": float(probs.min()) if probs.size else 0.0, "from_global": row["from_global"],
                   "context_len": row["context_len"], "prev_draft_len": prev[0], "prev_match_len": prev[1],
                   "hist_draft_share": float(np.mean([du.size > 0 for _, du in hist])) if hist else 0.0,
                   "hist_yield_mean": float(np.mean(yields)) if yields else 0.0,
                   "hist_yield_max": float(max(yields)) if yields else 0.0,
                   "lookup_ms": row["lookup_ms"], "oracle_accepted": common_prefix(d, out[t:]),
                   "model_accepted": int(model_acc[r][t])}
            for name, v in zip(CHAR_CLASSES, char_class_shares(classes, d), strict=True):
                rec[f"draft_{name}"] = float(v)
            for name, v in zip(CHAR_CLASSES, char_class_shares(classes, ctx[ctx.size - m:] if m else ctx[:0]), strict=True):
                rec[f"ctx_{name}"] = float(v)
            rows.append(rec)
            earlier.append((t, d))
            prev = (int(d.size), int(m))
    return pl.DataFrame(rows)
