"""Workloads: prompt sets in JSONL (or Parquet), each row optionally with its reference continuation.

A row is one of:

- ``{"prompt": "...", "reference": "..."}`` (``response`` or ``completion`` are read as the
  reference too: prompt/response pairs of logged traffic);
- an OpenAI-style chat record ``{"messages": [...], "tools": [...]}`` with tool calls and tool
  results as agents log them (:mod:`svt.collect.chat`). With ``turns: last`` (the default) the last
  assistant turn is the reference and the messages before it are the prompt; with ``turns: all``
  each assistant turn is one request, its prompt the conversation so far (the agentic setting:
  the requests of one conversation follow each other in order);
- a benchmark question ``{"turns": ["...", ...], "category": "..."}``: the question files of
  MT-Bench and Spec-Bench (``question.jsonl``) and SPEED-Bench's rows (its Parquet files too), read
  as a one-turn chat: the first turn is the user's message (a later turn follows the model's own
  answer to the first, which a one-prompt request cannot give); a ``reference`` list holds one
  reference per turn (MT-Bench's are the judge's answer keys, on math, reasoning and coding only);
- a ShareGPT conversation ``{"conversations": [{"from": ..., "value": ...}]}``, read as the chat
  record it is.

A row's ``category`` (benchmark questions and any other row) becomes its workload label
``FILE/CATEGORY``, so ``svt evaluate --by workload`` compares the categories.

Which rows run: every row once, round-robin across the workloads (a workload that runs out drops
out of the rotation); ``requests`` takes the first ones (omitted: all). Asking for more requests
than the rows hold is refused unless ``repeat: true``: a repeated row's answer is already in a suffix
cache's global tree, which inflates the cache's yield. A reference run skips the rows that have no
usable reference (``on_missing_reference: skip``, counted in run.json) or refuses them (``error``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from svt.collect.chat import Message, parse_messages, parse_tools, plain_body, sharegpt_messages
from svt.config import builtin_dir, resolve_path
from svt.errors import ConfigError
from svt.fileio import file_sha256, json_objects

TURNS = ("last", "all")


@dataclass(frozen=True)
class Prompt:
    workload: str
    text: str | None  # plain prompt
    messages: tuple[Message, ...] | None  # chat-style: the conversation before the answer
    reference: str | None = None  # the continuation a strong model or a person wrote (a chat answer's text)
    where: str = ""  # file:line, for messages about this row
    whole_answer: bool = False  # the reference is a whole answer (a response, an assistant turn), not a window
    answer: Message | None = None  # chat records: the assistant turn that is the reference
    tools: str | None = None  # chat records: the record's tool schemas (JSON text)
    row: int = 0  # the row of its file it comes from


REFERENCE_KEYS = ("reference", "response", "completion")


def resolve_workload(name: str, config_path: str | Path | None = None) -> Path:
    """A built-in workload's name (``code`` -> svt's data/workloads/code.jsonl) or a path to a file."""
    if not name.endswith((".jsonl", ".json", ".parquet")) and "/" not in name:
        path = builtin_dir("workloads") / f"{name}.jsonl"
        if not path.is_file():
            known = sorted(p.stem for p in builtin_dir("workloads").glob("*.jsonl"))
            raise ConfigError(f"Workload {name!r}: not a built-in workload ({', '.join(known)}); give a path to "
                              "a .jsonl, .json or .parquet file for your own.")
        return path
    path = resolve_path(name, config_path)
    if not path.is_file():
        raise ConfigError(f"Workload {name!r}: file {str(path)!r} not found" + _path_rule(name, config_path))
    return path


def _path_rule(name: str, config_path) -> str:
    if Path(name).expanduser().is_absolute():
        return "."
    if config_path is None:
        return " (a relative path is read from the current directory)."
    return f" (a relative path in a config is read from the config's folder, {str(Path(config_path).parent)!r})."


def read_workload(path: Path, turns: str = "last", counts: dict | None = None) -> list[Prompt]:
    """Read one JSONL (or Parquet) workload; a bad line is an error naming the file and line.
    ``counts`` gets ``assistant_turns_without_prompt``: with ``turns: all``, the assistant turns
    that open a conversation (nothing before them to prompt with), which are no requests."""
    if turns not in TURNS:
        raise ConfigError(f"Expected `turns` to be last or all, but got {turns!r}.")
    name = path.stem
    if path.suffix.lower() == ".parquet":  # SPEED-Bench's files
        rows = [(f"{path} record {i + 1}", obj) for i, obj in enumerate(_parquet_rows(path))]
    else:  # JSON Lines, or a JSON list of objects (ShareGPT's layout)
        rows = list(json_objects(path))
    counts = {} if counts is None else counts
    counts.setdefault("assistant_turns_without_prompt", 0)
    prompts = [p for i, (where, obj) in enumerate(rows) for p in _row(obj, name, where, turns, i, counts)]
    if not rows:
        raise ConfigError(f"{path}: the workload holds no prompts.")
    return prompts


def _parquet_rows(path: Path) -> list[dict]:
    import polars as pl

    try:
        return pl.read_parquet(path).to_dicts()
    except Exception as exc:  # polars' errors for a damaged file: one message naming it
        raise ConfigError(f"{path}: not a readable Parquet file ({type(exc).__name__}).") from None


def _row(obj: dict, name: str, where: str, turns: str, row: int, counts: dict) -> list[Prompt]:
    category = obj.get("category")
    label = f"{name}/{category}" if isinstance(category, str) and category else name
    if "turns" in obj and "messages" not in obj:
        return [_question(obj, label, where, row)]
    if "conversations" in obj and "messages" not in obj:
        return _chat(sharegpt_messages(obj["conversations"], where), obj, label, where, turns, row, counts)
    return _record(obj, label, where, turns, row, counts)


def _question(obj: dict, label: str, where: str, row: int) -> Prompt:
    """A benchmark question (MT-Bench, Spec-Bench, SPEED-Bench): its first turn as the user's
    message, and the first reference when the row has references."""
    turns = obj["turns"]
    if not (isinstance(turns, list) and turns and all(isinstance(t, str) for t in turns) and turns[0].strip()):
        raise ConfigError(f"{where}: `turns` must be a non-empty list of strings with a non-empty first turn.")
    ref = obj.get("reference")
    if isinstance(ref, list):
        ref = ref[0] if ref else None
    if ref is not None and not isinstance(ref, str):
        raise ConfigError(f"{where}: `reference` must be a string or a list of strings (one per turn).")
    answer = Message("assistant", ref) if ref else None
    return Prompt(label, None, (Message("user", turns[0]),), ref or None, where, whole_answer=bool(ref),
                  answer=answer, row=row)


def _record(obj: dict, name: str, where: str, turns: str, row: int, counts: dict) -> list[Prompt]:
    refs = [k for k in REFERENCE_KEYS if k in obj]
    if len(refs) > 1:
        raise ConfigError(f"{where}: give the reference once, but the row has {' and '.join(refs)}.")
    reference = obj[refs[0]] if refs else None
    if reference is not None and not isinstance(reference, str):
        raise ConfigError(f"{where}: `{refs[0]}` must be a string, but got {type(reference).__name__}.")
    whole = bool(refs) and refs[0] != "reference"
    if "prompt" in obj and "messages" in obj:
        raise ConfigError(f"{where}: the row has both `prompt` and `messages`; give one of them.")
    if isinstance(obj.get("prompt"), str) and obj["prompt"]:
        return [Prompt(name, obj["prompt"], None, reference, where, whole, row=row)]
    if "messages" in obj:
        msgs = parse_messages(obj["messages"], where)
        if reference is not None:
            if msgs[-1].role == "assistant":
                raise ConfigError(f"{where}: the record ends with an assistant turn and also has `{refs[0]}`; "
                                  "give the reference once.")
            msgs = (*msgs, Message("assistant", reference))
        return _chat(msgs, obj, name, where, turns, row, counts)
    raise ConfigError(
        f"{where}: expected a non-empty string `prompt` or a list `messages`, but got keys {sorted(obj)}."
    )


def _chat(msgs: tuple[Message, ...], obj: dict, name: str, where: str, turns: str, row: int,
          counts: dict) -> list[Prompt]:
    """One prompt per answered assistant turn (``all``) or for the last one (``last``; a record
    that does not end with the assistant is a prompt without reference)."""
    tools = parse_tools(obj.get("tools"), where)
    if turns == "last" or not any(m.role == "assistant" for m in msgs):
        if msgs[-1].role != "assistant":
            return [Prompt(name, None, msgs, None, where, tools=tools, row=row)]
        if len(msgs) == 1:
            raise ConfigError(f"{where}: the chat record holds only an assistant turn: no prompt before it.")
        return [_answered(name, msgs[:-1], msgs[-1], where, tools, row)]
    # as with `last`, an assistant turn is a request when any message comes before it
    out = [_answered(name, msgs[:i], m, f"{where} turn {i + 1}", tools, row)
           for i, m in enumerate(msgs) if m.role == "assistant" and i > 0]
    counts["assistant_turns_without_prompt"] += msgs[0].role == "assistant"  # counted, never dropped unsaid
    if msgs[-1].role != "assistant":  # the conversation waits for an answer: a prompt without reference
        out.append(Prompt(name, None, msgs, None, f"{where} after turn {len(msgs)} (unanswered)", tools=tools,
                          row=row))
    if not out:
        raise ConfigError(f"{where}: the chat record holds only an assistant turn: no prompt before it.")
    return out


def _answered(name: str, before: tuple[Message, ...], answer: Message, where: str, tools, row: int) -> Prompt:
    return Prompt(name, None, before, plain_body(answer), where, True, answer, tools, row)


def has_reference(p: Prompt) -> bool:
    """A usable reference: one with some text, or an assistant turn that calls a tool."""
    return bool(p.reference and p.reference.strip())


def require_references(prompts: list[Prompt]) -> None:
    """Every prompt must carry a non-empty reference (``on_missing_reference: error``)."""
    for p in prompts:
        if p.reference is None:
            raise ConfigError(f"{p.where}: no reference. A reference run needs the continuation of every prompt: "
                              "`reference` (or `response` / `completion`) beside `prompt`, or a chat record "
                              "whose last message is the assistant's turn; `on_missing_reference: skip` skips "
                              "such rows.")
        if not has_reference(p):
            raise ConfigError(f"{p.where}: the reference is empty.")


def interleave(workloads: list[list[Prompt]], n: int | None = None, *, repeat: bool = False) -> list[Prompt]:
    """Round-robin across workloads, each row once (a workload that runs out leaves the rotation);
    the first ``n`` (None: all). More than the rows is refused unless ``repeat`` (then the whole
    sequence starts again)."""
    order: list[Prompt] = []
    for i in range(max((len(w) for w in workloads), default=0)):
        order.extend(w[i] for w in workloads if i < len(w))
    if n is None:
        return order
    if n > len(order) and not repeat:
        sizes = ", ".join(f"{w[0].workload.split('/')[0]} {len(w)}" for w in workloads if w)
        raise ConfigError(f"`requests` is {n}, but the workloads hold {len(order)} prompts ({sizes}). Each row runs "
                          "once by default: omit `requests` (all rows), lower it, or set `repeat: true` (a repeated "
                          "row's answer is already in the suffix cache's global tree, which inflates its yield).")
    if not order:
        raise ConfigError("The workloads hold no prompts to run.")
    return [order[i % len(order)] for i in range(n)]


@dataclass
class WorkloadSet:
    """The prompts a collection runs: the workloads' names and files (with content hashes, so a
    resumed or merged run can check it reads the same prompts), the prompts taken round-robin
    across them, and how they were read (run.json's ``workload_reading``)."""

    names: list[str]
    paths: list[Path]
    prompts: list[Prompt]
    hashes: dict[str, str]
    reading: dict = field(default_factory=dict)

    @property
    def files(self) -> dict[str, str]:
        return {n: str(p) for n, p in zip(self.names, self.paths, strict=True)}


def workload_entry(entry, default_turns: str) -> tuple[str, str]:
    """A config's workload entry (a name or path, or ``{path: ..., turns: last|all}``) as (path, turns)."""
    if isinstance(entry, str):
        return entry, default_turns
    return entry["path"], entry.get("turns", default_turns)


def load_workloads(workloads: list, requests: int | None, config_path: str | Path | None = None, *,
                   turns: str = "last", repeat: bool = False, need_reference: bool = False,
                   on_missing_reference: str = "skip", keep=None) -> WorkloadSet:
    """Resolve, read and interleave a config's workloads (names must be distinct). With
    ``need_reference`` (a reference run) rows without a usable reference are skipped and counted,
    or refused (``on_missing_reference: error``). ``keep``: a predicate of the rows that can run
    (``on_long_head: skip``: a head that fits); the others are left out and counted
    (``skipped_long_head``) *before* the requests are picked, so ``requests`` usable rows run."""
    entries = [workload_entry(w, turns) for w in workloads]
    paths = [resolve_workload(w, config_path) for w, _ in entries]
    names = [p.stem for p in paths]
    if len(set(names)) != len(names):
        raise ConfigError(f"Workload names must be distinct, but got {names}.")
    counts = [{} for _ in paths]
    read = [read_workload(p, t, c) for p, (_, t), c in zip(paths, entries, counts, strict=True)]
    skipped = {}
    if need_reference:
        if on_missing_reference == "error":
            for w in read:
                require_references(w)
        skipped = {n: sum(not has_reference(p) for p in w) for n, w in zip(names, read, strict=True)}
        read = [[p for p in w if has_reference(p)] for w in read]
        empty = [n for n, w in zip(names, read, strict=True) if not w]
        if empty:
            raise ConfigError(f"Workload {empty[0]!r}: no row has a usable reference (a non-empty `reference`, "
                              "`response` or `completion`, or a last assistant turn), so a reference run has "
                              "nothing to measure.")
    long = None
    if keep is not None:
        flags = [[keep(p) for p in w] for w in read]  # each row tokenized once
        long = {n: sum(not f for f in fs) for n, fs in zip(names, flags, strict=True)}
        read = [[p for p, f in zip(w, fs, strict=True) if f] for w, fs in zip(read, flags, strict=True)]
        if not any(read):
            raise ConfigError("Every prompt's head is longer than max_prompt_tokens: nothing is left to run. Raise "
                              "max_prompt_tokens.")
    prompts = interleave(read, requests, repeat=repeat)
    source = {p.where: n for n, w in zip(names, read, strict=True) for p in w}
    seen, repeated, taken = set(), 0, dict.fromkeys(names, 0)
    for p in prompts:
        repeated += p.where in seen
        seen.add(p.where)
        taken[source[p.where]] += 1
    reading = {"turns": {n: t for n, (_, t) in zip(names, entries, strict=True)},
               "prompts": {n: len(w) for n, w in zip(names, read, strict=True)},
               "requests": len(prompts), "requests_per_workload": taken, "repeat": repeat,
               "repeated_requests": repeated,
               **({"assistant_turns_without_prompt": {n: c["assistant_turns_without_prompt"] for n, c in
                                                      zip(names, counts, strict=True)}}
                  if any(c["assistant_turns_without_prompt"] for c in counts) else {})}
    if need_reference:
        reading["on_missing_reference"] = on_missing_reference
        reading["skipped_no_reference"] = skipped
    if long is not None:
        reading["skipped_long_head"] = long
    return WorkloadSet(names, paths, prompts, {n: file_sha256(p) for n, p in zip(names, paths, strict=True)},
                       reading)
