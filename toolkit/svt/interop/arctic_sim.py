"""``arctic-sim``: the per-step records of arctic-inference's suffix-decoding simulator.

arctic-inference (Snowflake, version 0.3) ships ``arctic_inference.suffix_decoding.simulator``,
which replays a dataset's responses through a SuffixDecoding cache and writes one CSV row per
request and step: ``task_id`` (one configuration of its sweep), ``request_id``, ``step``,
``num_spec_toks`` (drafted), ``num_accept_toks`` (accepted), ``num_out_toks``, ``spec_ms`` (the
cache lookup), ``match_len``, ``score``, and the configuration (``max_depth``, ``max_spec_factor``,
``min_token_prob``, ``use_tree_spec``, ...). Each task becomes a workload (``task 0``, ...), so
``svt evaluate --by workload`` compares the configurations. Tree speculation (``use_tree_spec``)
drafts trees, not chains: a file of tree rows becomes a tree run whose steps hold the tree's size and
accepted path length (the simulator writes no per-node rows, so no ``tree_drafts``); a file mixing
tree and chain rows is refused. There is no target model, so no verify time.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from svt.interop.base import COUNT_MAX, Imported, Importer, chain_drafts, fail
from svt.interop.records import row_where, table_file

NEEDED = ("task_id", "request_id", "step", "num_spec_toks", "num_accept_toks", "num_out_toks", "spec_ms")


class ArcticSim(Importer):
    name = "arctic-sim"
    description = "arctic-inference's suffix-decoding simulator output (one CSV row per request and step)"

    def read(self, path: Path, mapping: dict | None = None) -> Imported:
        f = table_file(path)
        missing = [c for c in NEEDED if c not in f.columns]
        if missing:
            raise fail(str(path), f"not simulator output: no column {', '.join(missing)} (found {', '.join(f.columns)}).")
        f = f.with_row_index("_row")
        for col in NEEDED[:-1]:  # integers: a 2.5 or a word is an error, never a truncation
            x = pl.col(col).cast(pl.Float64, strict=False)
            bad = f.filter(x.is_null() | (x < 0) | (x != x.floor()) | (x > (COUNT_MAX if col.startswith("num_") else 2**62)))
            if bad.height:
                raise fail(row_where(path, bad["_row"][0]), f"`{col}` is {bad[col][0]!r}, not an integer from 0"
                                                            + (f" to {COUNT_MAX}." if col.startswith("num_") else "."))
        f = f.with_columns(pl.col(c).cast(pl.Float64).cast(pl.Int64) for c in NEEDED[:-1])
        ms = pl.col("spec_ms").cast(pl.Float64, strict=False)
        bad = f.filter(ms.is_null() | ~ms.is_finite() | (ms < 0))
        if bad.height:
            raise fail(row_where(path, bad["_row"][0]), f"`spec_ms` is {bad['spec_ms'][0]!r}, not a time in ms.")
        if "use_tree_spec" in f.columns:
            flag = pl.col("use_tree_spec").cast(pl.String).str.strip_chars().str.to_lowercase()
            odd = f.filter(flag.is_null() | ~flag.is_in(["true", "false", "1", "0"]))
            if odd.height:
                v = odd["use_tree_spec"][0]
                raise fail(row_where(path, odd["_row"][0]), "use_tree_spec is empty (a truncated row?), not true or false."
                           if v is None else f"use_tree_spec is {v!r}, not true or false.")
            is_tree = f.select(flag.is_in(["true", "1"])).to_series()
            if is_tree.any() and not is_tree.all():
                row = f.filter(is_tree != is_tree[0])["_row"][0]
                raise fail(row_where(path, row), f"use_tree_spec is {not is_tree[0]} here but {is_tree[0]} in the first "
                                                 "row: tree and chain speculation make different runs; split the file by "
                                                 "use_tree_spec and import each.")
            tree = bool(is_tree.all())
        else:
            tree = False
        over = f.filter(pl.col("num_accept_toks") > pl.col("num_spec_toks"))
        if over.height:
            raise fail(row_where(path, over["_row"][0]), "more tokens accepted than drafted.")
        out = f.filter((pl.col("num_out_toks") != pl.col("num_accept_toks"))
                       & (pl.col("num_out_toks") != pl.col("num_accept_toks") + 1))
        if out.height:
            raise fail(row_where(path, out["_row"][0]), f"num_out_toks {out['num_out_toks'][0]} with "
                                                        f"{out['num_accept_toks'][0]} accepted (expected accepted + 1, "
                                                        "or accepted at the response's end).")
        f = f.sort("task_id", "request_id", "step")
        keys = f.select("task_id", "request_id").unique(maintain_order=True).with_row_index("request")
        f = f.join(keys, on=["task_id", "request_id"], how="left", maintain_order="left")
        dup = f.filter(pl.struct("request", "step").is_duplicated())
        if dup.height:
            raise fail(row_where(path, dup["_row"][0]), f"task {dup['task_id'][0]} request {dup['request_id'][0]} has "
                                                        f"step {dup['step'][0]} more than once.")
        f = f.with_columns(pl.format("task {}", pl.col("task_id")).alias("workload"))
        if tree:  # no per-node rows: the steps carry the tree's size and the accepted path's length
            drafts = pl.DataFrame(schema={"request": pl.Int64, "step": pl.Int32, "position": pl.Int16,
                                          "label": pl.Int8, "workload": pl.String})
        else:
            drafts = chain_drafts(f["request"].to_numpy(), f["step"].to_numpy(), f["num_spec_toks"].to_numpy(),
                                  f["num_accept_toks"].to_numpy(), str(path)).join(
                f.select(pl.col("request").cast(pl.Int64), "workload").unique("request"), on="request", how="left",
                maintain_order="left")
        steps = f.select(pl.col("request").cast(pl.Int64), "step", pl.col("num_spec_toks").alias("drafted"),
                         pl.col("num_accept_toks").alias("accepted"), pl.col("num_out_toks").alias("emitted"),
                         pl.col("spec_ms").alias("draft_ms"))
        reqs = keys.join(f.select("request", "workload").unique("request"), on="request").select(
            pl.col("request").cast(pl.Int64), "workload").sort("request")
        config_cols = [c for c in f.columns if c not in (*NEEDED, "_row", "request", "workload", "match_len", "score")]
        tasks = {str(t): {c: v for c, v in row.items() if c != "task_id"}
                 for t, row in ((r["task_id"], r) for r in f.select("task_id", *config_cols).unique("task_id")
                                .sort("task_id").iter_rows(named=True))}
        return Imported(drafts, steps, reqs, lacks={"requests": ["prompt_ids", "output_ids", "finish_reason"]},
                        source={"drafter": "SuffixDecoding cache (arctic-inference simulator)", "tasks": tasks,
                                "requests": keys.height},
                        request_names=[f"task {t} request {r}" for t, r in keys.select("task_id", "request_id").rows()],
                        drafter="cache",
                        tree={"shape": "SuffixDecoding (arctic-inference use_tree_spec)", "proposals": "suffix tree",
                              "verify": "the simulator's: the path the response follows", "per_node": False,
                              "note": "counts per step only: steps.drafted is the tree's size, steps.accepted the "
                                      "accepted path's length; no tree_drafts"} if tree else None)
