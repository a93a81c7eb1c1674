"""Workloads: prompt sets in JSONL (or Parquet), each row optionally with its reference continuation.

A row is one of:

- ``{"prompt": "...", "reference": "..."}`` (``response`` or ``completion`` are read as the
  reference too: prompt/response pairs of logged traffic);
- an OpenAI-style chat record ``{"messages": [{"role": ..., "content": ...}, ...]}``: when the
  last message is an ``assistant`` turn it is the reference (what the served model answered) and
  the messages before it are the prompt, rendered with the tokenizer's chat template where it has
  one;
- a benchmark question ``{"turns": ["...", ...], "category": "..."}``: the question files of
  MT-Bench and Spec-Bench (``question.jsonl``) and SPEED-Bench's rows (its Parquet files too). The
  first turn is the prompt (a later turn follows the model's own answer to the first, which a
  one-prompt request cannot give); a ``reference`` list holds one reference per turn;
- a ShareGPT conversation ``{"conversations": [{"from": "human" | "gpt" | "system", "value": ...}]}``,
  read as the chat record it is.

A row's ``category`` (benchmark questions and any other row) becomes its workload label
``FILE/CATEGORY``, so ``svt evaluate --by workload`` compares the categories.

The reference is what a strong model or a person wrote after the prompt. A reference run
(``svt collect --engine reference``) takes it as the output; a target run keeps it beside the
output, so the report can say how far the pair is from the data.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from svt.config import resolve_path
from svt.errors import ConfigError
from svt.fileio import file_sha256, json_objects

BUILTIN_DIR = Path("data") / "workloads"


@dataclass(frozen=True)
class Prompt:
    workload: str
    text: str | None  # plain prompt
    messages: tuple | None  # chat-style: ((role, content), ...)
    reference: str | None = None  # the continuation a strong model or a person wrote
    where: str = ""  # file:line, for messages about this row
    whole_answer: bool = False  # the reference is a whole answer (a response, an assistant turn), not a window


REFERENCE_KEYS = ("reference", "response", "completion")


def resolve_workload(name: str, config_path: str | Path | None = None) -> Path:
    """A workload name (``code`` -> data/workloads/code.jsonl) or a path to a JSONL file."""
    candidate = name if name.endswith((".jsonl", ".json", ".parquet")) or "/" in name else str(BUILTIN_DIR / f"{name}.jsonl")
    path = resolve_path(candidate, config_path)
    if not path.is_file():
        raise ConfigError(f"Workload {name!r}: file {str(path)!r} not found.")
    return path


def read_workload(path: Path) -> list[Prompt]:
    """Read one JSONL (or Parquet) workload; a bad line is an error naming the file and line."""
    prompts = []
    name = path.stem
    if path.suffix.lower() == ".parquet":  # SPEED-Bench's files
        prompts = [_row(obj, name, f"{path} record {i + 1}") for i, obj in enumerate(_parquet_rows(path))]
    else:  # JSON Lines, or a JSON list of objects (ShareGPT's layout)
        prompts = [_row(obj, name, where) for where, obj in json_objects(path)]
    if not prompts:
        raise ConfigError(f"{path}: the workload holds no prompts.")
    return prompts


def _parquet_rows(path: Path) -> list[dict]:
    import polars as pl

    try:
        return pl.read_parquet(path).to_dicts()
    except Exception as exc:  # polars' errors for a damaged file: one message naming it
        raise ConfigError(f"{path}: not a readable Parquet file ({type(exc).__name__}).") from None


SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant",
                  "bing": "assistant", "bard": "assistant", "system": "system"}


def _row(obj: dict, name: str, where: str) -> Prompt:
    category = obj.get("category")
    label = f"{name}/{category}" if isinstance(category, str) and category else name
    if "turns" in obj:
        return _question(obj, label, where)
    if "conversations" in obj and "messages" not in obj:
        obj = {**{k: v for k, v in obj.items() if k != "conversations"}, "messages": _sharegpt(obj["conversations"], where)}
    return _record(obj, label, where)


def _question(obj: dict, label: str, where: str) -> Prompt:
    """A benchmark question (MT-Bench, Spec-Bench, SPEED-Bench): its first turn, and the first
    reference when the row has references."""
    turns = obj["turns"]
    if not (isinstance(turns, list) and turns and all(isinstance(t, str) for t in turns) and turns[0].strip()):
        raise ConfigError(f"{where}: `turns` must be a non-empty list of strings with a non-empty first turn.")
    ref = obj.get("reference")
    if isinstance(ref, list):
        ref = ref[0] if ref else None
    if ref is not None and not isinstance(ref, str):
        raise ConfigError(f"{where}: `reference` must be a string or a list of strings (one per turn).")
    return Prompt(label, turns[0], None, ref or None, where, whole_answer=ref is not None)


def _sharegpt(conv, where: str) -> list[dict]:
    if not isinstance(conv, list) or not conv:
        raise ConfigError(f"{where}: `conversations` must be a non-empty list of turns.")
    out = []
    for i, turn in enumerate(conv):
        if not (isinstance(turn, dict) and isinstance(turn.get("value"), str)):
            raise ConfigError(f"{where}: turn {i + 1} of `conversations` needs a string `value`.")
        role = SHAREGPT_ROLES.get(str(turn.get("from", "")).lower())
        if role is None:
            raise ConfigError(f"{where}: turn {i + 1} is from {turn.get('from')!r}; expected one of "
                              f"{', '.join(sorted(SHAREGPT_ROLES))}.")
        out.append({"role": role, "content": turn["value"]})
    return out


def _record(obj: dict, name: str, where: str) -> Prompt:
    refs = [k for k in REFERENCE_KEYS if k in obj]
    if len(refs) > 1:
        raise ConfigError(f"{where}: give the reference once, but the row has {' and '.join(refs)}.")
    reference = obj[refs[0]] if refs else None
    if reference is not None and not isinstance(reference, str):
        raise ConfigError(f"{where}: `{refs[0]}` must be a string, but got {type(reference).__name__}.")
    whole = bool(refs) and refs[0] != "reference"
    if isinstance(obj.get("prompt"), str) and obj["prompt"]:
        return Prompt(name, obj["prompt"], None, reference, where, whole)
    if isinstance(obj.get("messages"), list) and obj["messages"]:
        msgs = []
        for m in obj["messages"]:
            if not (isinstance(m, dict) and isinstance(m.get("content"), str)):
                raise ConfigError(f"{where}: each message needs a string `content`.")
            msgs.append((str(m.get("role", "user")), m["content"]))
        if msgs[-1][0] == "assistant":
            if reference is not None:
                raise ConfigError(f"{where}: the record ends with an assistant turn and also has `{refs[0]}`; "
                                  "give the reference once.")
            reference, whole = msgs.pop()[1], True
            if not msgs:
                raise ConfigError(f"{where}: the chat record holds only an assistant turn: no prompt before it.")
        return Prompt(name, None, tuple(msgs), reference, where, whole)
    raise ConfigError(
        f"{where}: expected a non-empty string `prompt` or a list `messages`, but got keys {sorted(obj)}."
    )


def require_references(prompts: list[Prompt]) -> None:
    """Every prompt must carry a non-empty reference (a reference run's output)."""
    for p in prompts:
        if p.reference is None:
            raise ConfigError(f"{p.where}: no reference. A reference run needs the continuation of every prompt: "
                              "`reference` (or `response` / `completion`) beside `prompt`, or a chat record "
                              "whose last message is the assistant's turn.")
        if not p.reference.strip():
            raise ConfigError(f"{p.where}: the reference is empty.")


def encode_reference(prompt: Prompt, tokenizer, max_tokens: int) -> list[int]:
    """Token ids of a prompt's reference (its first ``max_tokens``). A whole answer (a response,
    an assistant turn) ends with the tokenizer's end of sequence, as a served answer does; a
    ``reference`` window (the built-in workloads' file text) does not."""
    return reference_ids(prompt, tokenizer, max_tokens)[0]


def reference_ids(prompt: Prompt, tokenizer, max_tokens: int) -> tuple[list[int], bool]:
    """(:func:`encode_reference`'s ids, whether ``max_tokens`` cut the reference)."""
    ids = list(tokenizer.encode(prompt.reference or "", add_special_tokens=False))
    if not ids:
        raise ConfigError(f"{prompt.where}: the reference encodes to no tokens.")
    eos = getattr(tokenizer, "eos_token_id", None)
    if prompt.whole_answer and eos is not None:
        ids.append(int(eos))
    return ids[:max_tokens], len(ids) > max_tokens


def interleave(workloads: list[list[Prompt]], n: int) -> list[Prompt]:
    """``n`` prompts round-robin across workloads, cycling within each when it runs out."""
    out: list[Prompt] = []
    i = 0
    while len(out) < n:
        for w in workloads:
            if len(out) < n:
                out.append(w[i % len(w)])
        i += 1
    return out


def encode_prompt(prompt: Prompt, tokenizer, max_tokens: int) -> list[int]:
    """Token ids of a prompt (chat template when the tokenizer has one), last ``max_tokens`` kept."""
    if prompt.messages is not None:
        if getattr(tokenizer, "chat_template", None):
            ids = tokenizer.apply_chat_template(
                [{"role": r, "content": c} for r, c in prompt.messages], add_generation_prompt=True,
                tokenize=True,
            )
            if isinstance(ids, dict):
                ids = ids["input_ids"]
        else:
            ids = tokenizer.encode("\n".join(c for _, c in prompt.messages) + "\n", add_special_tokens=False)
    else:
        ids = tokenizer.encode(prompt.text, add_special_tokens=False)
    ids = list(ids)[-max_tokens:]
    if not ids:
        raise ConfigError(f"A prompt of workload {prompt.workload!r} encodes to no tokens.")
    return ids


@dataclass
class WorkloadSet:
    """The prompts a collection runs: the workloads' names and files (with content hashes, so a
    resumed or merged run can check it reads the same prompts) and the ``requests`` prompts taken
    round-robin across them."""

    names: list[str]
    paths: list[Path]
    prompts: list[Prompt]
    hashes: dict[str, str]

    @property
    def files(self) -> dict[str, str]:
        return {n: str(p) for n, p in zip(self.names, self.paths, strict=True)}


def load_workloads(workloads: list[str], requests: int, config_path: str | Path | None = None) -> WorkloadSet:
    """Resolve, read and interleave a config's workloads (names must be distinct)."""
    paths = [resolve_workload(w, config_path) for w in workloads]
    names = [p.stem for p in paths]
    if len(set(names)) != len(names):
        raise ConfigError(f"Workload names must be distinct, but got {names}.")
    prompts = interleave([read_workload(p) for p in paths], requests)
    return WorkloadSet(names, paths, prompts, {n: file_sha256(p) for n, p in zip(names, paths, strict=True)})
