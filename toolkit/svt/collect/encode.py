"""Prompts and references as token ids, rendered as the model itself would see them.

- A ``prompt`` row is its text's tokens; its reference is the reference text's tokens (a whole
  answer, i.e. a ``response`` or ``completion``, ends with the tokenizer's end of sequence).
- A chat record, with a tokenizer that has a chat template, is rendered by ``apply_chat_template``
  (the record's ``tools`` passed as transformers passes tools) and tokenized as transformers does
  (no special tokens added): the prompt is the conversation with the generation prompt, and the
  reference is exactly what the assistant's turn adds to it: the conversation is rendered with the
  turn, checked to extend the prompt's text (a template that rewrites earlier turns is refused
  with the reason), and the added text is tokenized on its own, as the model writes it after the
  prompt (a byte-level BPE would merge the prompt's last newline with the answer's indentation if
  the two were tokenized together). The template's end-of-turn marker ends the reference; no end
  of sequence is added.
- A chat record, with a tokenizer without a template, uses svt's plain rendering
  (:func:`svt.collect.chat.plain_prompt`): ``### ROLE`` headers, tool calls as
  ``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` lines, so a suffix cache sees them; the
  reference is the assistant turn's text followed by the end of sequence.

``max_prompt_tokens`` keeps a prompt's last tokens after rendering; a chat prompt keeps its head
(everything rendered before the first non-system message's content: the template's opening, the
tools, the system turns) intact, or is refused when the head alone does not fit or cannot be
located. A template that does not render a turn's tool calls is refused (they would be lost).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

from svt.collect.chat import plain_head, plain_prompt
from svt.collect.workloads import Prompt, WorkloadSet
from svt.errors import ConfigError


@dataclass
class Encoded:
    prompt_ids: list[int]
    reference_ids: list[int] | None  # None: the prompt has no reference
    cut: bool = False  # max_new_tokens cut the reference


def has_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def _ids(out) -> list[int]:
    """Token ids from what a tokenizer call returns (a list, or a BatchEncoding / dict)."""
    if hasattr(out, "keys") and "input_ids" in out.keys():
        out = out["input_ids"]
    return [int(t) for t in out]


def _render(tokenizer, prompt: Prompt, messages, generation_prompt: bool) -> str:
    """The template's text (tokenized as transformers tokenizes it: no special tokens added)."""
    tools = json.loads(prompt.tools) if prompt.tools else None
    try:
        text = tokenizer.apply_chat_template([m.for_template() for m in messages], tools=tools,
                                             add_generation_prompt=generation_prompt, tokenize=False)
    except Exception as exc:  # jinja's TemplateError (raise_exception in the template), a missing field, ...
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"{prompt.where}: the tokenizer's chat template failed on this record: {msg}") from None
    if not isinstance(text, str):
        raise ConfigError(f"{prompt.where}: the chat template rendered {type(text).__name__}, not text.")
    return text


def _tokens(tokenizer, text: str) -> list[int]:
    return _ids(tokenizer(text, add_special_tokens=False))


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _template_head(tokenizer, prompt: Prompt, text: str, ids: list[int]) -> int | None:
    """How many of the prompt's tokens a cut must keep: everything before the first non-system
    message's content (the template's opening, the tools, the system turns and that message's
    header). Found without rendering a partial conversation (templates may refuse one): the prompt
    rendered again with that content changed differs from it exactly there. None when it cannot be
    located."""
    first = next((i for i, m in enumerate(prompt.messages) if m.role != "system"), None)
    if first is None:
        return None
    m = prompt.messages[first]
    other = replace(m, content="\u2063" + m.content)  # changed at its first character
    try:
        changed = _render(tokenizer, prompt, (*prompt.messages[:first], other, *prompt.messages[first + 1:]), True)
    except ConfigError:
        return None
    at = _common(list(text), list(changed))
    if at >= len(text):
        return None
    return _common(_tokens(tokenizer, text[:at]), ids)


def _check_calls(prompt: Prompt, text: str, what: str) -> None:
    """Every tool call of ``what`` (the prompt's turns, or the answer) is in the rendered text: a
    template that does not render tool calls would drop them silently."""
    msgs = prompt.messages if what == "prompt" else (prompt.answer,)
    for m in msgs:
        for c in m.tool_calls:
            if c.name not in text:
                raise ConfigError(f"{prompt.where}: the chat template does not render the tool call {c.name!r} of the "
                                  f"{'answer' if what != 'prompt' else 'conversation'}: its tool calls would be lost. "
                                  "Use a template that renders `tool_calls` (or a tokenizer without a template: "
                                  "svt's plain rendering keeps them).")


class LongHead(ConfigError):
    """A prompt whose head (template opening, tools, system turns) alone exceeds max_prompt_tokens:
    no cut keeps it whole."""

    def __init__(self, prompt: Prompt, head: int, limit: int):
        self.prompt, self.head, self.limit = prompt, head, limit
        super().__init__(f"{prompt.where}: the prompt's head (the template's opening, tools and system turns) takes "
                         f"{head} tokens, more than max_prompt_tokens = {limit}; raise it, or the prompt would lose "
                         "its system turn.")


def encode(prompt: Prompt, tokenizer, max_prompt_tokens: int, max_new_tokens: int) -> Encoded:
    """A prompt's token ids (cut to ``max_prompt_tokens``) and its reference's (to ``max_new_tokens``)."""
    if prompt.messages is None:
        ids = _ids(tokenizer.encode(prompt.text, add_special_tokens=False))
        head = lambda: 0  # noqa: E731
        ref = _plain_reference(prompt, tokenizer)
    elif has_template(tokenizer):
        text = _render(tokenizer, prompt, prompt.messages, True)
        _check_calls(prompt, text, "prompt")
        ids = _tokens(tokenizer, text)
        head = lambda: _template_head(tokenizer, prompt, text, ids)  # noqa: E731
        ref = None
        if prompt.answer is not None:
            full = _render(tokenizer, prompt, (*prompt.messages, prompt.answer), False)
            if not full.startswith(text):
                raise ConfigError(
                    f"{prompt.where}: the chat template does not render the conversation with the assistant's turn "
                    "as the prompt followed by that turn (the prompt's text is not a prefix of it: the template "
                    "rewrites earlier text, e.g. drops reasoning or dates the system turn), so the tokens the turn "
                    "adds are not defined.")
            _check_calls(prompt, full[len(text):], "answer")
            # what the model writes after the prompt: the added text, tokenized on its own
            ref = _tokens(tokenizer, full[len(text):])
            if not ref:
                raise ConfigError(f"{prompt.where}: the chat template renders the assistant's turn as no tokens.")
    else:
        ids = _ids(tokenizer.encode(plain_prompt(prompt.messages, prompt.tools), add_special_tokens=False))
        head_text = plain_head(prompt.messages, prompt.tools)
        head = lambda: _common(_ids(tokenizer.encode(head_text, add_special_tokens=False)), ids)  # noqa: E731
        ref = _plain_reference(prompt, tokenizer)
    if not ids:
        raise ConfigError(f"{prompt.where}: the prompt encodes to no tokens.")
    if len(ids) > max_prompt_tokens:
        keep = head()
        if keep is None:
            raise ConfigError(f"{prompt.where}: the prompt ({len(ids)} tokens) is longer than max_prompt_tokens = "
                              f"{max_prompt_tokens}, and where its head (the template's opening, tools and system "
                              "turns) ends cannot be located, so a cut could drop it; raise max_prompt_tokens.")
        if keep >= max_prompt_tokens:
            raise LongHead(prompt, keep, max_prompt_tokens)
        ids = ids[:keep] + ids[len(ids) - (max_prompt_tokens - keep):]
    if ref is None:
        return Encoded(ids, None)
    return Encoded(ids, ref[:max_new_tokens], len(ref) > max_new_tokens)


def _plain_reference(prompt: Prompt, tokenizer) -> list[int] | None:
    if prompt.reference is None:
        return None
    ids = _ids(tokenizer.encode(prompt.reference, add_special_tokens=False))
    if not ids:
        raise ConfigError(f"{prompt.where}: the reference encodes to no tokens.")
    eos = getattr(tokenizer, "eos_token_id", None)
    if prompt.whole_answer and eos is not None:
        ids.append(int(eos))
    return ids


def encode_all(prompts: list[Prompt], tokenizer, max_prompt_tokens: int, max_new_tokens: int) -> list[Encoded]:
    """Every prompt encoded; prompts whose head exceeds ``max_prompt_tokens`` are named in one error."""
    out, long = [], []
    for p in prompts:
        try:
            out.append(encode(p, tokenizer, max_prompt_tokens, max_new_tokens))
        except LongHead as exc:
            long.append(exc)
    if long:
        raise _long_heads(long)
    return out


def _long_heads(long: list[LongHead]) -> ConfigError:
    rows = list(dict.fromkeys(f"{e.prompt.where} ({e.head})" for e in long))
    return ConfigError(f"{len(long)} prompt(s) have a head (the template's opening, tools and system turns) longer "
                       f"than max_prompt_tokens = {long[0].limit} tokens, so no cut keeps their system turn: "
                       f"{'; '.join(rows[:8])}{f'; and {len(rows) - 8} more' if len(rows) > 8 else ''}. Raise "
                       "max_prompt_tokens, or set `on_long_head: skip` to leave them out (counted in run.json).")


def head_fits(tokenizer, max_prompt_tokens: int, max_new_tokens: int):
    """The predicate ``load_workloads(keep=...)`` takes under ``on_long_head: skip``: a prompt whose
    head fits ``max_prompt_tokens``."""
    def fits(prompt: Prompt) -> bool:
        try:
            encode(prompt, tokenizer, max_prompt_tokens, max_new_tokens)
        except LongHead:
            return False
        except ConfigError:  # another problem of the row: said when (and only if) the row is picked
            return True
        return True
    return fits


def long_head_filter(cfg, config_path):
    """``head_fits`` for a collect config under ``on_long_head: skip`` (the target's tokenizer), else None."""
    if cfg.on_long_head != "skip":
        return None
    from svt.config import resolve_path
    from svt.models.loading import load_tokenizer

    return head_fits(load_tokenizer(resolve_path(cfg.target, config_path)), cfg.max_prompt_tokens, cfg.max_new_tokens)


def encode_workloads(workloads: WorkloadSet, tokenizer, max_prompt_tokens: int, max_new_tokens: int,
                     on_long_head: str = "error") -> list[Encoded]:
    """:func:`encode_all` over a collection's prompts. With ``on_long_head: skip`` the prompts whose
    head exceeds ``max_prompt_tokens`` are removed from ``workloads.prompts`` and counted per
    workload in ``workloads.reading["skipped_long_head"]``; the prompts that stay keep their order."""
    if on_long_head != "skip" or "skipped_long_head" in workloads.reading:  # (left out when they were read)
        return encode_all(workloads.prompts, tokenizer, max_prompt_tokens, max_new_tokens)
    kept, out, skipped = [], [], dict.fromkeys(workloads.names, 0)
    for p in workloads.prompts:
        try:
            out.append(encode(p, tokenizer, max_prompt_tokens, max_new_tokens))
            kept.append(p)
        except LongHead:
            skipped[p.workload.split("/", 1)[0]] += 1  # a workload's label may add /category
    if not kept:
        raise ConfigError(f"Every prompt's head is longer than max_prompt_tokens = {max_prompt_tokens}: nothing "
                          "is left to run. Raise max_prompt_tokens.")
    workloads.prompts = kept
    reading = workloads.reading
    reading["skipped_long_head"] = skipped
    reading["requests"] = len(kept)
    if isinstance(reading.get("requests_per_workload"), dict):
        reading["requests_per_workload"] = {n: c - skipped.get(n, 0) for n, c in reading["requests_per_workload"].items()}
    return out


def encode_prompt(prompt: Prompt, tokenizer, max_tokens: int) -> list[int]:
    """A prompt's token ids (chat template when the tokenizer has one), cut to ``max_tokens``."""
    return encode(prompt, tokenizer, max_tokens, 1).prompt_ids


def encode_reference(prompt: Prompt, tokenizer, max_tokens: int) -> list[int]:
    """A prompt's reference ids, their first ``max_tokens``."""
    ids = encode(prompt, tokenizer, 2**31, max_tokens).reference_ids
    if ids is None:
        raise ConfigError(f"{prompt.where}: no reference.")
    return ids


def position_limit(model_dir) -> int | None:
    """A model's ``max_position_embeddings`` (from its config.json), None when it does not say."""
    from pathlib import Path

    path = Path(model_dir) / "config.json"
    try:
        cfg = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = cfg.get(key) or (cfg.get("text_config") or {}).get(key)
        if isinstance(value, int) and value > 0:
            return value
    return None


def check_positions(prompts: list[Prompt], lengths: list[int], limit: int | None, what: str, fix: str) -> None:
    """Every request's positions (``lengths``: prompt + what follows it) fit ``limit``; else one
    error naming the first rows that do not, before any work."""
    if limit is None:
        return
    over = [(p, n) for p, n in zip(prompts, lengths, strict=True) if n > limit]
    if over:
        shown = "; ".join(f"{p.where} needs {n}" for p, n in over[:3])
        raise ConfigError(f"{len(over)} request(s) need more positions than {what} allows "
                          f"(max_position_embeddings {limit:,}): {shown}{' ...' if len(over) > 3 else ''}. {fix}")
