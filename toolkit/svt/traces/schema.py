"""The trace schema: the tables of a run directory, their columns and dtypes, and its version.

A run directory holds ``run.json`` plus one folder of Parquet shards per table. This module is the
contract between collectors (svt's or another engine's) and every later stage.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class TableSchema:
    """Columns a table must have (name -> dtype) and which of them may hold nulls. ``optional``:
    columns a run may carry or not (name -> dtype; e.g. a drafter's own confidence, which only some
    drafters compute): where present they are typed, range-checked and carried in every shard of
    the table alike; where absent a reader that needs one says so."""

    name: str
    columns: dict[str, pl.DataType]
    nullable: frozenset[str] = frozenset()
    # columns that must lie in [0, 1] (probabilities); checked on read
    probabilities: frozenset[str] = frozenset()
    required: bool = True
    optional: dict[str, pl.DataType] = field(default_factory=dict)

    def present(self, names) -> dict[str, pl.DataType]:
        """The columns a shard with columns ``names`` holds: every required one, then the optional
        ones it carries (name -> dtype)."""
        return {**self.columns, **{c: t for c, t in self.optional.items() if c in names}}


DRAFTS = TableSchema(
    "drafts",
    {
        "workload": pl.String(),
        "request": pl.Int64(),
        "step": pl.Int32(),
        "position": pl.Int16(),
        "token": pl.Int32(),
        "q_max": pl.Float32(),
        "q_sampled": pl.Float32(),
        "q_entropy": pl.Float32(),
        "q_margin": pl.Float32(),
        "p_sampled": pl.Float32(),
        "p_max": pl.Float32(),
        "accept_prob": pl.Float32(),
        "accept_prob_expected": pl.Float32(),
        "label": pl.Int8(),
    },
    # the target's columns are null on drafts live AV trimmed before verification (never computed)
    nullable=frozenset({"label", "p_sampled", "p_max", "accept_prob", "accept_prob_expected", "confidence"}),
    probabilities=frozenset(
        {"q_max", "q_sampled", "q_margin", "p_sampled", "p_max", "accept_prob", "accept_prob_expected",
         "confidence"}
    ),
    # a drafter's own confidence head (DSpark): its probability that the draft is accepted given the
    # drafts before it were, computed from the slot's hidden state and the previous token when drafting
    optional={"confidence": pl.Float32()},
)

STEPS = TableSchema(
    "steps",
    {
        "request": pl.Int64(),
        "step": pl.Int32(),
        "drafted": pl.Int16(),
        "accepted": pl.Int16(),
        "emitted": pl.Int16(),
        "draft_ms": pl.Float32(),
        "verify_ms": pl.Float32(),
        "batch_size": pl.Int16(),
        "kept": pl.Int16(),  # drafts verified (< drafted when live AV trimmed the rest)
        "explored": pl.Boolean(),  # every draft verified this step (always true without live AV)
    },
)

REQUESTS = TableSchema(
    "requests",
    {
        "request": pl.Int64(),
        "workload": pl.String(),
        "prompt_ids": pl.List(pl.Int32()),
        "output_ids": pl.List(pl.Int32()),
        "finish_reason": pl.String(),
    },
)

HIDDEN = TableSchema(
    "hidden",
    {
        "request": pl.Int64(),
        "step": pl.Int32(),
        "position": pl.Int16(),
        "hidden": pl.List(pl.Float16()) if hasattr(pl, "Float16") else pl.List(pl.Float32()),
    },
    required=False,
)

DISTS = TableSchema(
    "dists",
    {
        "request": pl.Int64(),
        "step": pl.Int32(),
        "position": pl.Int16(),
        "token": pl.Int32(),
        "q_top_ids": pl.List(pl.Int32()),
        "q_top_probs": pl.List(pl.Float32()),
        "q_tail": pl.Float32(),
        "p_top_ids": pl.List(pl.Int32()),
        "p_top_probs": pl.List(pl.Float32()),
        "p_tail": pl.Float32(),
    },
    probabilities=frozenset({"q_tail", "p_tail"}),
    required=False,
)

_SHARES = tuple(f"{w}_{c}" for w in ("draft", "ctx") for c in ("punct", "digit", "space", "newline", "bracket"))

CACHE_DRAFTS = TableSchema(
    "cache_drafts",
    {
        "request": pl.Int64(),
        "workload": pl.String(),
        "decode_pos": pl.Int32(),  # output tokens already generated
        "draft_ids": pl.List(pl.Int32()),
        "draft_len": pl.Int16(),
        "match_len": pl.Int16(),
        "score": pl.Float32(),  # arctic-inference: sum of the draft tokens' estimated probabilities
        "prob_mean": pl.Float32(),
        "prob_min": pl.Float32(),
        "from_global": pl.Boolean(),  # the draft came from the global tree of finished responses
        "context_len": pl.Int32(),
        "prev_draft_len": pl.Int16(),
        "prev_match_len": pl.Int16(),
        "hist_draft_share": pl.Float32(),
        "hist_yield_mean": pl.Float32(),
        "hist_yield_max": pl.Float32(),
        **{c: pl.Float32() for c in _SHARES},
        "lookup_ms": pl.Float32(),
        "oracle_accepted": pl.Int16(),  # common prefix of draft_ids with output_ids[decode_pos:]
        "model_accepted": pl.Int16(),  # the model drafter's accepted length from decode_pos (K drafts)
    },
    probabilities=frozenset({"prob_mean", "prob_min", "hist_draft_share", *_SHARES}),
    required=False,
)

REFERENCES = TableSchema(
    "references",
    {
        "request": pl.Int64(),
        "reference_ids": pl.List(pl.Int32()),  # the prompt's reference continuation (max_new_tokens at most)
    },
    required=False,
)

TREE_DRAFTS = TableSchema(
    "tree_drafts",
    {
        "workload": pl.String(),
        "request": pl.Int64(),
        "step": pl.Int32(),
        "node": pl.Int16(),  # topological order within the step's tree
        "parent": pl.Int16(),  # -1: a child of the root (the context)
        "depth": pl.Int16(),  # 0-based: the chain's position
        "token": pl.Int32(),
        "rank": pl.Int16(),  # sibling rank: the order verification tries siblings in
        "q_max": pl.Float32(),  # of the drafter's distribution the node was proposed from (at its parent)
        "q_token": pl.Float32(),  # that distribution's probability of the node's token
        "q_entropy": pl.Float32(),
        "path_prob": pl.Float32(),  # product of q_token from the root down to the node
        "p_token": pl.Float32(),  # the target's probability of the token at the node's parent
        "accept_prob": pl.Float32(),  # the probability verification accepted it with (null: not tried)
        "label": pl.Int8(),  # 1 on the accepted path, 0 verified and rejected, null not reached
        "match": pl.Int8(),  # greedy runs: 1 if the token is the target's argmax at its parent (every node)
    },
    nullable=frozenset({"accept_prob", "label", "match"}),
    probabilities=frozenset({"q_max", "q_token", "path_prob", "p_token", "accept_prob"}),
    required=False,
)

CACHE_TREES = TableSchema(
    "cache_trees",
    {
        "request": pl.Int64(),
        "workload": pl.String(),
        "decode_pos": pl.Int32(),  # the cache_drafts row the tree was proposed at
        "node": pl.Int16(),  # arctic-inference's order within the tree (every parent first)
        "parent": pl.Int16(),  # -1: a child of the context
        "depth": pl.Int16(),
        "token": pl.Int32(),
        "prob": pl.Float32(),  # the suffix tree's estimated probability of reaching the node
        "label": pl.Int8(),  # greedy verification against the output: 1 accepted, 0 rejected, null not reached
        "score": pl.Float32(),  # per tree: the sum of prob
        "match_len": pl.Int16(),  # per tree
        "from_global": pl.Boolean(),  # per tree
        "lookup_ms": pl.Float32(),  # per tree: the tree lookup's time
    },
    nullable=frozenset({"label"}),
    probabilities=frozenset({"prob"}),
    required=False,
)

SCHEDULE = TableSchema(
    "schedule",
    {
        "tick": pl.Int32(),  # the engine step: ``steps.step`` of the rows it decoded (continuous runs)
        "batch_size": pl.Int16(),  # rows decoded at this step
        "admitted": pl.Int16(),  # requests prefilled into free slots just before it
        "prefill_ms": pl.Float32(),  # their prefill (and joining the batch)
        "draft_ms": pl.Float32(),
        "verify_ms": pl.Float32(),
        "step_ms": pl.Float32(),  # the whole step: draft, verify, acceptance, bookkeeping, cache compaction
        "draft_passes": pl.Int16(),  # drafts proposed in a row this step (< K when AV+length stopped every row early)
        "verify_tokens": pl.Int32(),  # positions the target forward computed (every row's y and drafts, trimmed or not)
        "emitted": pl.Int32(),  # tokens emitted by all rows
    },
    required=False,
    # the time inside the step's model forwards (its work outside them: step_ms - forward_ms)
    # ``verify_slots``: the target cache's width at the verify forward (this step's tokens, padding
    # and not-yet-compacted holes included): the context every row's attention read
    optional={"forward_ms": pl.Float32(), "verify_slots": pl.Int32()},
)

TABLES: dict[str, TableSchema] = {t.name: t for t in (DRAFTS, STEPS, REQUESTS, HIDDEN, DISTS, CACHE_DRAFTS,
                                                      REFERENCES, TREE_DRAFTS, CACHE_TREES, SCHEDULE)}
FINISH_REASONS = ("stop", "length")


def get_table(name: str) -> TableSchema:
    """The schema of a table by name; an unknown name lists the known ones."""
    try:
        return TABLES[name]
    except KeyError:
        raise ValueError(f"Unknown trace table {name!r}; known tables: {', '.join(TABLES)}.") from None
