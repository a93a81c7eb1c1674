"""Workloads: prompt sets in JSONL (``{"prompt": ...}`` or chat-style ``{"messages": [...]}``)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from svt.config import resolve_path
from svt.errors import ConfigError

BUILTIN_DIR = Path("data") / "workloads"


@dataclass(frozen=True)
class Prompt:
    workload: str
    text: str | None  # plain prompt
    messages: tuple | None  # chat-style: ((role, content), ...)


def resolve_workload(name: str, config_path: str | Path | None = None) -> Path:
    """A workload name (``code`` -> data/workloads/code.jsonl) or a path to a JSONL file."""
    candidate = name if name.endswith(".jsonl") or "/" in name else str(BUILTIN_DIR / f"{name}.jsonl")
    path = resolve_path(candidate, config_path)
    if not path.is_file():
        raise ConfigError(f"Workload {name!r}: file {str(path)!r} not found.")
    return path


def read_workload(path: Path) -> list[Prompt]:
    """Read one JSONL workload; a bad line is an error naming the file and line."""
    prompts = []
    name = path.stem
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{where}: not valid JSON ({exc.msg}).") from None
            if not isinstance(obj, dict):
                raise ConfigError(f"{where}: expected a JSON object with `prompt` or `messages`.")
            if isinstance(obj.get("prompt"), str) and obj["prompt"]:
                prompts.append(Prompt(name, obj["prompt"], None))
            elif isinstance(obj.get("messages"), list) and obj["messages"]:
                msgs = []
                for m in obj["messages"]:
                    if not (isinstance(m, dict) and isinstance(m.get("content"), str)):
                        raise ConfigError(f"{where}: each message needs a string `content`.")
                    msgs.append((str(m.get("role", "user")), m["content"]))
                prompts.append(Prompt(name, None, tuple(msgs)))
            else:
                raise ConfigError(
                    f"{where}: expected a non-empty string `prompt` or a list `messages`, "
                    f"but got keys {sorted(obj)}."
                )
    if not prompts:
        raise ConfigError(f"{path}: the workload holds no prompts.")
    return prompts


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
